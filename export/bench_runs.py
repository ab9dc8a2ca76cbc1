"""The measurements of `zoo bench`, one function per family, each PyTorch eager against ONNX
Runtime on the same weights and inputs.

Every figure is a dict of plain numbers: the timing (median, p10, p90, min, max, runs) and, where
it applies, the work (FLOPs or bytes), the rate achieved and its fraction of the machine's limit
(FLOP/s of one large matmul through the same library for forward passes; read bandwidth for
decoding steps, which read every weight once per token).

ONNX Runtime figures: "ort" is the fastest path the export offers (the shared-cache loop of an
--optimize decoder export, else the plain loop); "ort_plain" is the contract graph driven with
numpy feeds, the way other runtimes use it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from export.contract import past_names
from export.cost import model_cost, onnx_matmul_weight_bytes
from export.generate import generate
from export.kv_session import SharedCacheSession
from export.machine import read_bandwidth
from export.runtime import Runtime
from export.timing import Timing, measure
from registry.catalog import Card

Figure = dict[str, float]


@dataclass
class Context:
    runtime: Runtime
    model: nn.Module
    card: Card
    device: str
    repeats: int
    limits: dict[str, float]  # ort_flops_per_s, torch_flops_per_s, bound_bytes_per_s
    progress: Callable[[str], None]

    @property
    def sync(self) -> Callable[[], object] | None:
        return torch.cuda.synchronize if self.device == "cuda" else None

    def bound(self) -> float:
        """Read bandwidth probed right before a bandwidth-bound figure: on these shared
        machines it drifted between about 45 and 80 GB/s from one minute to the next. The
        fraction reported is of the larger of this and the run's start/end probes (see
        bench.rescale), so a slow local probe cannot flatter a figure."""
        figures = read_bandwidth(self.runtime.provider, self.runtime.threads, repeats=2,
                                 with_numpy=False)
        return figures["bound_bytes_per_s"]

    def time(self, label: str, run: Callable[[], object], slow: bool = False,
             setup: Callable[[], object] | None = None, torch_side: bool = False) -> Timing:
        repeats = max(2, self.repeats // 3) if slow else self.repeats
        self.progress(f"bench {self.card.name}: {label} ({repeats} runs)")
        return measure(run, repeats, setup=setup, sync=self.sync if torch_side else None)


def figure(timing: Timing, limit: float | None = None, flops: float | None = None,
           bytes_read: float | None = None, tokens: float | None = None) -> Figure:
    result = timing.as_dict()
    if flops is not None:
        result["gflop"] = flops / 1e9
        result["gflop_per_s"] = flops / timing.median / 1e9
        result["limit_gflop_per_s"] = limit / 1e9
        result["fraction_of_limit"] = flops / timing.median / limit
    if bytes_read is not None:
        result["mbytes_per_token"] = bytes_read / 1e6
        rate = bytes_read * (tokens or 1.0) / timing.median
        result["gbytes_per_s"] = rate / 1e9
        result["probe_gbytes_per_s"] = limit / 1e9
        result["limit_gbytes_per_s"] = limit / 1e9
        result["fraction_of_limit"] = rate / limit
    if tokens is not None:
        result["tokens_per_s"] = tokens / timing.median
    return result


def _tensor(ctx: Context, array: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(np.ascontiguousarray(array)).to(ctx.device)


def _random_cache(ctx: Context, batch: int, length: int, numpy: bool) -> list:
    card = ctx.card
    shape = (batch, card["n_heads"], length, card["d_model"] // card["n_heads"])
    rng = np.random.default_rng(length)
    arrays = [rng.standard_normal(shape, np.float32) for _ in range(2 * card["n_layers"])]
    return arrays if numpy else [_tensor(ctx, a) for a in arrays]


# --- decoders -------------------------------------------------------------------------------

def _torch_greedy(model: nn.Module, prompt: torch.Tensor, new_tokens: int) -> None:
    """Greedy decoding in eager PyTorch with its key/value cache (the fair comparison)."""
    batch, length = prompt.shape
    mask = torch.ones(batch, length, dtype=torch.long, device=prompt.device)
    positions = torch.arange(length, device=prompt.device)[None]
    logits, past = model(prompt, mask, positions, None)
    for _ in range(new_tokens - 1):
        token = logits[:, -1].argmax(-1, keepdim=True)
        mask = torch.cat([mask, torch.ones_like(token)], dim=1)
        positions = positions[:, -1:] + 1
        logits, past = model(token, mask, positions, past)


def _decode_step_torch(ctx: Context, past: int, bytes_read: float, bound: float
                       ) -> dict[str, Figure]:
    cache = _random_cache(ctx, 1, past, numpy=False)
    pairs = tuple((cache[i], cache[i + 1]) for i in range(0, len(cache), 2))
    token = torch.tensor([[5]], device=ctx.device)
    mask = torch.ones(1, past + 1, dtype=torch.long, device=ctx.device)
    position = torch.tensor([[past]], device=ctx.device)
    with torch.no_grad():
        t = ctx.time(f"decode at past {past} (torch)",
                     lambda: ctx.model(token, mask, position, pairs), torch_side=True)
    return {"torch": figure(t, bound, bytes_read=bytes_read)}


def decoder_lengths(card: Card) -> tuple[int, int, list[int]]:
    """Prompt length, new tokens and the past lengths to time (clipped to the card)."""
    limit = card["max_positions"]
    prompt = min(32, limit // 2)
    new_tokens = min(64, limit - prompt)
    pasts = sorted({min(past, limit - 1) for past in (16, 256, 1000)})
    return prompt, new_tokens, pasts


def bench_decoder(ctx: Context) -> dict[str, dict[str, Figure]]:
    card, model, runtime = ctx.card, ctx.model, ctx.runtime
    cost = model_cost(model, card)
    prompt_length, new_tokens, pasts = decoder_lengths(card)
    rng = np.random.default_rng(0)
    prompt = rng.integers(3, card["vocab_size"], (1, prompt_length), dtype=np.int64)
    token = np.array([[5]], np.int64)
    inputs = past_names(card["n_layers"], "past_key_values")
    kv = runtime.kv_graph
    torch_weights = 4.0 * (cost.layer_params + cost.head_params)
    ort_weights = onnx_matmul_weight_bytes(runtime.folder / (kv.path.name if kv else "model.onnx"))
    plain_weights = onnx_matmul_weight_bytes(runtime.folder / "model.onnx")
    results: dict[str, dict[str, Figure]] = {}

    # Prefill: the prompt in one pass. PyTorch and the contract graph compute logits for every
    # prompt token; the shared-cache graph only for the last.
    prompt_t = _tensor(ctx, prompt)
    ones = torch.ones_like(prompt_t)
    positions = torch.arange(prompt_length, device=ctx.device)[None]
    with torch.no_grad():
        t = ctx.time(f"prefill {prompt_length} (torch)",
                     lambda: model(prompt_t, ones, positions, None), torch_side=True)
    entry = {"torch": figure(t, ctx.limits["torch_flops_per_s"],
                             cost.decoder_forward(prompt_length, 0, prompt_length))}
    empty = dict(zip(inputs, _random_cache(ctx, 1, 0, numpy=True), strict=True))
    plain_feeds = {"input_ids": prompt, "attention_mask": np.ones_like(prompt),
                   "position_ids": np.arange(prompt_length)[None], **empty}
    t = ctx.time(f"prefill {prompt_length} (ort plain)",
                 lambda: runtime.run("model.onnx", plain_feeds))
    entry["ort_plain"] = figure(t, ctx.limits["ort_flops_per_s"],
                                cost.decoder_forward(prompt_length, 0, prompt_length))
    session = SharedCacheSession(kv, card, card["max_positions"]) if kv else None
    if session is not None:
        t = ctx.time(f"prefill {prompt_length} (ort)", lambda: session.prefill(prompt, None))
        entry["ort"] = figure(t, ctx.limits["ort_flops_per_s"],
                              cost.decoder_forward(prompt_length, 0, 1))
    else:
        entry["ort"] = entry["ort_plain"]
    results[f"prefill_{prompt_length}"] = entry

    # One decoding step after `past` tokens: reads every weight and the cache once.
    for past in pasts:
        cache_bytes = cost.cache_bytes(1, past + 1)
        bound = ctx.bound()
        entry = _decode_step_torch(ctx, past, torch_weights + cache_bytes, bound)
        feeds = {"input_ids": token, "attention_mask": np.ones((1, past + 1), np.int64),
                 "position_ids": np.array([[past]]),
                 **dict(zip(inputs, _random_cache(ctx, 1, past, numpy=True), strict=True))}
        t = ctx.time(f"decode at past {past} (ort plain)",
                     lambda feeds=feeds: runtime.run("model.onnx", feeds))
        entry["ort_plain"] = figure(t, bound, bytes_read=plain_weights + cache_bytes)
        if session is not None:
            session.prefill(prompt[:, :1], None)

            def rewind(past: int = past) -> None:  # the step appends; time the same step
                session.lengths[:] = past

            t = ctx.time(f"decode at past {past} (ort)", lambda: session.step(token[:, 0]),
                         setup=rewind)
            entry["ort"] = figure(t, bound, bytes_read=ort_weights + cache_bytes)
        else:
            entry["ort"] = entry["ort_plain"]
        results[f"decode_past_{past}"] = entry

    # Greedy generation: prompt, then new tokens one at a time, each engine with its cache.
    average_cache = cost.cache_bytes(1, prompt_length + new_tokens // 2)
    bound = ctx.bound()
    with torch.no_grad():
        t = ctx.time(f"greedy {new_tokens} tokens (torch)",
                     lambda: _torch_greedy(model, prompt_t, new_tokens), slow=True,
                     torch_side=True)
    entry = {"torch": figure(t, bound, bytes_read=torch_weights + average_cache,
                             tokens=new_tokens)}
    t = ctx.time(f"greedy {new_tokens} tokens (ort plain)",
                 lambda: generate(runtime, prompt, None, new_tokens, shared_cache=False),
                 slow=True)
    entry["ort_plain"] = figure(t, bound, bytes_read=plain_weights + average_cache,
                                tokens=new_tokens)
    if kv is not None:
        t = ctx.time(f"greedy {new_tokens} tokens (ort)",
                     lambda: generate(runtime, prompt, None, new_tokens), slow=True)
        entry["ort"] = figure(t, bound, bytes_read=ort_weights + average_cache,
                              tokens=new_tokens)
    else:
        entry["ort"] = entry["ort_plain"]
    results[f"greedy_{new_tokens}"] = entry
    return results


# --- encoders -------------------------------------------------------------------------------

def _encoder_feeds(card: Card, batch: int, length: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(batch)
    feeds = {"input_ids": rng.integers(3, card["vocab_size"], (batch, length), dtype=np.int64),
             "attention_mask": np.ones((batch, length), np.int64)}
    if card["type_vocab_size"]:
        feeds["token_type_ids"] = np.zeros((batch, length), np.int64)
    return feeds


def _encoder_batch(ctx: Context, flops: float, feeds: dict[str, np.ndarray]
                   ) -> dict[str, Figure]:
    batch, length = feeds["input_ids"].shape
    tensors = [_tensor(ctx, value) for value in feeds.values()]
    with torch.no_grad():
        t = ctx.time(f"forward batch {batch} x {length} (torch)", lambda: ctx.model(*tensors),
                     slow=batch > 1, torch_side=True)
    entry = {"torch": figure(t, ctx.limits["torch_flops_per_s"], flops)}
    t = ctx.time(f"forward batch {batch} x {length} (ort)",
                 lambda: ctx.runtime.run("model.onnx", feeds), slow=batch > 1)
    entry["ort"] = entry["ort_plain"] = figure(t, ctx.limits["ort_flops_per_s"], flops)
    return entry


def bench_encoder(ctx: Context) -> dict[str, dict[str, Figure]]:
    card = ctx.card
    cost = model_cost(ctx.model, card)
    length = min(128, card["max_positions"])
    results = {}
    for batch in (1, 8):
        results[f"forward_b{batch}_s{length}"] = _encoder_batch(ctx, cost.encoder_forward(
            batch, length), _encoder_feeds(card, batch, length))
    return results


# --- encoder-decoder ------------------------------------------------------------------------

def bench_seq2seq(ctx: Context) -> dict[str, dict[str, Figure]]:
    card, model, runtime = ctx.card, ctx.model, ctx.runtime
    cost = model_cost(model, card)
    limit = card["max_positions"]
    source = min(128, limit)
    rng = np.random.default_rng(0)
    ids = rng.integers(3, card["vocab_size"], (1, source), dtype=np.int64)
    mask = np.ones_like(ids)
    ids_t, mask_t = _tensor(ctx, ids), _tensor(ctx, mask)
    results = {}
    with torch.no_grad():
        t = ctx.time(f"encoder 1 x {source} (torch)", lambda: model.encode(ids_t, mask_t),
                     torch_side=True)
    flops = cost.source_forward(1, source)
    entry = {"torch": figure(t, ctx.limits["torch_flops_per_s"], flops)}
    feeds = {"input_ids": ids, "attention_mask": mask}
    t = ctx.time(f"encoder 1 x {source} (ort)", lambda: runtime.run("encoder.onnx", feeds))
    entry["ort"] = entry["ort_plain"] = figure(t, ctx.limits["ort_flops_per_s"], flops)
    results[f"encoder_b1_s{source}"] = entry

    memory = rng.standard_normal((1, source, card["d_model"]), np.float32)
    # Per step the contract graph re-projects the encoder memory to cross keys/values.
    weights = 4.0 * (cost.layer_params + cost.cross_kv_params + cost.head_params)
    for past in sorted({min(p, limit - 1) for p in (16, 256)}):
        bytes_read = weights + cost.cache_bytes(1, past + 1) + memory.nbytes
        results[f"decode_past_{past}"] = _seq2seq_step(ctx, past, memory, mask, bytes_read)
    return results


def _seq2seq_step(ctx: Context, past: int, memory: np.ndarray, mask: np.ndarray,
                  bytes_read: float) -> dict[str, Figure]:
    inputs = past_names(ctx.card["n_layers"], "past_key_values", ".decoder")
    token = np.array([[5]], np.int64)
    token_t, memory_t, mask_t = (_tensor(ctx, a) for a in (token, memory, mask))
    cache = _random_cache(ctx, 1, past, numpy=False)
    pairs = tuple((cache[i], cache[i + 1]) for i in range(0, len(cache), 2))
    bound = ctx.bound()
    with torch.no_grad():
        t = ctx.time(f"decode at past {past} (torch)",
                     lambda: ctx.model.decode(token_t, memory_t, mask_t, pairs), torch_side=True)
    entry = {"torch": figure(t, bound, bytes_read=bytes_read)}
    feeds = {"input_ids": token, "encoder_hidden_states": memory,
             "encoder_attention_mask": mask,
             **dict(zip(inputs, _random_cache(ctx, 1, past, numpy=True), strict=True))}
    t = ctx.time(f"decode at past {past} (ort)", lambda: ctx.runtime.run("decoder.onnx", feeds))
    entry["ort"] = entry["ort_plain"] = figure(t, bound, bytes_read=bytes_read)
    return entry


BENCHES = {"decoder": bench_decoder, "encoder": bench_encoder,
           "encoder-decoder": bench_seq2seq}
