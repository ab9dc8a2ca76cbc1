"""`zoo bench` on a decoder: prefill, one decoding step at several past lengths, and greedy
generation, each engine with its own key/value cache."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from export.bench.context import Context, Figure, figure, median, random_cache, tensor
from export.bench.cost import decoder_cost, onnx_matmul_weight_bytes
from export.bench.profile import op_times, profiled_graph
from registry.catalog import Card
from registry.sizes import cache_shape
from runtime.contract import CACHE_INPUT, MODEL_GRAPH, past_names
from runtime.decoding import DecoderSession
from runtime.sampling import Sampling, decode
from runtime.sessions import Runtime
from runtime.shared_cache import SharedCacheSession

GREEDY = Sampling()


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
    cache = random_cache(ctx, 1, past, numpy=False)
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


@dataclass
class DecoderPlan:
    """What the three measurements share: the prompt, the cost model, the graphs' weights."""

    cost: Any
    prompt: np.ndarray
    new_tokens: int
    pasts: list[int]
    inputs: list[str]  # the cache's input names
    kv: Any  # the shared-cache graph, or None
    torch_weights: float
    ort_weights: float
    plain_weights: float


def plan_decoder(ctx: Context) -> DecoderPlan:
    card, runtime = ctx.card, ctx.runtime
    cost = decoder_cost(ctx.model, card)
    prompt_length, new_tokens, pasts = decoder_lengths(card)
    rng = np.random.default_rng(0)
    kv = runtime.kv_graph
    return DecoderPlan(
        cost, rng.integers(3, card["vocab_size"], (1, prompt_length), dtype=np.int64),
        new_tokens, pasts, past_names(card["n_layers"], CACHE_INPUT), kv,
        4.0 * (cost.layer_params + cost.head_params),
        onnx_matmul_weight_bytes(kv.path if kv else runtime.graphs[MODEL_GRAPH].path),
        onnx_matmul_weight_bytes(runtime.graphs[MODEL_GRAPH].path))


def bench_decoder(ctx: Context) -> dict[str, dict[str, Figure]]:
    plan = plan_decoder(ctx)
    session = (SharedCacheSession(plan.kv, ctx.card, ctx.card["max_positions"])
               if plan.kv else None)
    return {f"prefill_{plan.prompt.shape[1]}": _prefill(ctx, plan, session),
            **_decode_steps(ctx, plan, session),
            f"greedy_{plan.new_tokens}": _greedy(ctx, plan)}


def _prefill(ctx: Context, plan: DecoderPlan, session: Any) -> dict[str, Figure]:
    """The prompt in one pass. PyTorch and the contract graph compute logits for every prompt
    token; the shared-cache graph only for the last."""
    prompt, length, cost = plan.prompt, plan.prompt.shape[1], plan.cost
    prompt_t = tensor(ctx, prompt)
    ones = torch.ones_like(prompt_t)
    positions = torch.arange(length, device=ctx.device)[None]
    with torch.no_grad():
        t = ctx.time(f"prefill {length} (torch)",
                     lambda: ctx.model(prompt_t, ones, positions, None), torch_side=True)
    entry = {"torch": figure(t, ctx.limits["torch_flops_per_s"],
                             cost.decoder_forward(length, 0, length))}
    empty = dict(zip(plan.inputs, random_cache(ctx, 1, 0, numpy=True), strict=True))
    plain_feeds = {"input_ids": prompt, "attention_mask": np.ones_like(prompt),
                   "position_ids": np.arange(length)[None], **empty}
    t = ctx.time(f"prefill {length} (ort plain)",
                 lambda: ctx.runtime.run(MODEL_GRAPH, plain_feeds))
    entry["ort_plain"] = figure(t, ctx.limits["ort_flops_per_s"],
                                cost.decoder_forward(length, 0, length))
    if session is not None:
        t = ctx.time(f"prefill {length} (ort)", lambda: session.prefill(prompt, None))
        entry["ort"] = figure(t, ctx.limits["ort_flops_per_s"],
                              cost.decoder_forward(length, 0, 1))
    else:
        entry["ort"] = entry["ort_plain"]
    return entry


def _decode_steps(ctx: Context, plan: DecoderPlan, session: Any
                  ) -> dict[str, dict[str, Figure]]:
    """One decoding step after `past` tokens: reads every weight and the cache once."""
    token = np.array([[5]], np.int64)
    results = {}
    for past in plan.pasts:
        cache_bytes = plan.cost.cache_bytes(1, past + 1)
        bound = ctx.bound()
        entry = _decode_step_torch(ctx, past, plan.torch_weights + cache_bytes, bound)
        feeds = {"input_ids": token, "attention_mask": np.ones((1, past + 1), np.int64),
                 "position_ids": np.array([[past]]),
                 **dict(zip(plan.inputs, random_cache(ctx, 1, past, numpy=True), strict=True))}
        t = ctx.time(f"decode at past {past} (ort plain)",
                     lambda feeds=feeds: ctx.runtime.run(MODEL_GRAPH, feeds))
        entry["ort_plain"] = figure(t, bound, bytes_read=plan.plain_weights + cache_bytes)
        if session is not None:
            session.prefill(plan.prompt[:, :1], None)

            def rewind(past: int = past) -> None:  # the step appends; time the same step
                session.lengths[:] = past

            t = ctx.time(f"decode at past {past} (ort)", lambda: session.step(token[:, 0]),
                         setup=rewind)
            entry["ort"] = figure(t, bound, bytes_read=plan.ort_weights + cache_bytes)
        else:
            entry["ort"] = entry["ort_plain"]
        results[f"decode_past_{past}"] = entry
    return results


def _greedy(ctx: Context, plan: DecoderPlan) -> dict[str, Figure]:
    """The prompt, then new tokens one at a time, each engine with its cache."""
    prompt, new_tokens = plan.prompt, plan.new_tokens
    average_cache = plan.cost.cache_bytes(1, prompt.shape[1] + new_tokens // 2)
    bound = ctx.bound()
    prompt_t = tensor(ctx, prompt)
    with torch.no_grad():
        t = ctx.time(f"greedy {new_tokens} tokens (torch)",
                     lambda: _torch_greedy(ctx.model, prompt_t, new_tokens), slow=True,
                     torch_side=True)
    entry = {"torch": figure(t, bound, bytes_read=plan.torch_weights + average_cache,
                             tokens=new_tokens)}
    mask = np.ones_like(prompt)
    t = ctx.time(f"greedy {new_tokens} tokens (ort plain)",
                 lambda: decode(DecoderSession(ctx.runtime), prompt, mask, new_tokens, GREEDY,
                                None), slow=True)
    entry["ort_plain"] = figure(t, bound, bytes_read=plan.plain_weights + average_cache,
                                tokens=new_tokens)
    if plan.kv is not None:
        capacity = prompt.shape[1] + new_tokens
        t = ctx.time(f"greedy {new_tokens} tokens (ort)",
                     lambda: decode(SharedCacheSession(plan.kv, ctx.card, capacity), prompt,
                                    mask, new_tokens, GREEDY, None), slow=True)
        entry["ort"] = figure(t, bound, bytes_read=plan.ort_weights + average_cache,
                              tokens=new_tokens)
    else:
        entry["ort"] = entry["ort_plain"]
    return entry


def decoder_summary(measurements: dict[str, dict[str, Figure]]) -> dict[str, float]:
    keys = list(measurements)
    greedy = next(k for k in keys if k.startswith("greedy_"))
    steps = [k for k in keys if k.startswith("decode_past_")]
    m = measurements
    return {
        "greedy_speedup_ort_over_torch": median(m, greedy, "torch") / median(m, greedy, "ort"),
        "greedy_ort_fraction_of_bandwidth": m[greedy]["ort"]["fraction_of_limit"],
        "decode_longest_over_shortest_past_ort": (median(m, steps[-1], "ort")
                                                  / median(m, steps[0], "ort")),
        "decode_longest_over_shortest_past_torch": (median(m, steps[-1], "torch")
                                                    / median(m, steps[0], "torch")),
    }


def decoder_profile(runtime: Runtime, card: Card, threads: int | None, folder: Path
                    ) -> dict[str, dict[str, float]]:
    """Per-operator times of one decoding step at the longest past: the contract graph, and
    the shared-cache graph where the export has one."""
    past = decoder_lengths(card)[2][-1]
    inputs = past_names(card["n_layers"], CACHE_INPUT)
    empty = np.zeros(cache_shape(card, 1, past), np.float32)
    feeds = {"input_ids": np.array([[5]]), "attention_mask": np.ones((1, past + 1), np.int64),
             "position_ids": np.array([[past]]), **{name: empty for name in inputs}}
    graph = profiled_graph(runtime.graphs[MODEL_GRAPH].path, runtime.provider, threads, folder)
    feeds = graph.in_graph_dtypes(feeds)
    result = {f"model.onnx decode step, past {past}": op_times(
        graph, lambda: graph.session.run(None, feeds))}
    entry = runtime.manifest.get("generation")
    if entry and runtime.provider == "cpu":
        kv = profiled_graph(runtime.folder / entry["file"], runtime.provider, threads, folder)
        session = SharedCacheSession(kv, card)
        session.prefill(np.array([[5]]), None)

        def step() -> None:
            session.lengths[:] = past
            session.step(np.array([5]))

        result[f"{entry['file']} decode step, past {past}"] = op_times(kv, step)
    return result
