"""`zoo bench` on the encoder-decoder: the source encoder, one decoding step at two past
lengths, and one step at source lengths 16, 128 and 512, before (the decoder re-projecting
the encoder output to cross keys/values every step: bench/recompute.py) and after (the cross
cache computed once, by the encoder)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch

from export.bench.context import Context, Figure, figure, median, random_cache, tensor
from export.bench.cost import Cost, seq2seq_cost
from export.bench.profile import temporary_folder
from export.bench.recompute import recomputing_graph
from export.bench.timing import measure_interleaved
from runtime.contract import CACHE_INPUT, DECODER, ENCODER, past_names
from runtime.sessions import Graph

SOURCES = (16, 128, 512)
# (PyTorch's run, ONNX Runtime's run, bytes one step reads)
Case = tuple[Callable[[], object], Callable[[], object], float]
STEP_PAST = 16


def bench_seq2seq(ctx: Context) -> dict[str, dict[str, Figure]]:
    card, model, runtime = ctx.card, ctx.model, ctx.runtime
    cost = seq2seq_cost(model, card)
    limit = card["max_positions"]
    source = min(128, limit)
    rng = np.random.default_rng(0)
    ids = rng.integers(3, card["vocab_size"], (1, source), dtype=np.int64)
    mask = np.ones_like(ids)
    ids_t, mask_t = tensor(ctx, ids), tensor(ctx, mask)
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

    for past in sorted({min(p, limit - 1) for p in (16, 256)}):
        torch_run, ort_run, bytes_read = _after(ctx, cost, past, source)
        bound = ctx.bound()
        label = f"decode at past {past}, source {source}"
        entry = {"torch": figure(ctx.time(f"{label} (torch)", torch_run, torch_side=True), bound,
                                 bytes_read=bytes_read)}
        entry["ort"] = entry["ort_plain"] = figure(ctx.time(f"{label} (ort)", ort_run), bound,
                                                   bytes_read=bytes_read)
        results[f"decode_past_{past}"] = entry
    with temporary_folder() as folder:
        before = recomputing_graph(model, card, Path(folder), "optimization" in runtime.manifest,
                                   runtime.provider, runtime.threads)
        results.update(_by_source(ctx, cost, before))
    return results


def _by_source(ctx: Context, cost: Cost, before: Graph) -> dict[str, dict[str, Figure]]:
    """A step at each source length, after and before the cross cache, every case timed in the
    same interleaved rounds (bench/timing.measure_interleaved): the load of a shared machine
    drifts within the minute this takes, and the targets are ratios between these cases."""
    lengths = sorted({min(s, ctx.card["max_positions"]) for s in SOURCES})
    runs, work = {}, {}
    for length in lengths:
        for key, case in ((f"decode_source_{length}", _after(ctx, cost, STEP_PAST, length)),
                          (f"decode_source_{length}_before", _before(ctx, cost, before, length))):
            torch_run, ort_run, work[key] = case
            runs[key, "torch"], runs[key, "ort"] = _synced(ctx, torch_run), ort_run
    ctx.progress(f"bench {ctx.card.name}: a step at source {', '.join(map(str, lengths))}, "
                 f"before and after the cross cache ({ctx.repeats} interleaved rounds)")
    timings = measure_interleaved(runs, ctx.repeats)
    bound = ctx.bound()
    results: dict[str, dict[str, Figure]] = {}
    for (key, engine), timing in timings.items():
        results.setdefault(key, {})[engine] = figure(timing, bound, bytes_read=work[key])
        if engine == "ort":
            results[key]["ort_plain"] = results[key]["ort"]
    return results


def _synced(ctx: Context, run: Callable[[], object]) -> Callable[[], object]:
    if ctx.sync is None:
        return run
    return lambda: (run(), ctx.sync())


def _source(ctx: Context, length: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(length)
    memory = rng.standard_normal((1, length, ctx.card["d_model"]), np.float32)
    return memory, np.ones((1, length), np.int64)


def _after(ctx: Context, cost: Cost, past: int, source: int) -> Case:
    """One step of decoder.onnx (and of PyTorch's decode): the cross keys/values come in,
    projected once per source."""
    model, n = ctx.model, ctx.card["n_layers"]
    memory, mask = _source(ctx, source)
    token = np.array([[5]], np.int64)
    token_t, mask_t = tensor(ctx, token), tensor(ctx, mask)
    with torch.no_grad():
        cross = model.cross_cache(tensor(ctx, memory))
    cache = random_cache(ctx, 1, past, numpy=False)
    pairs = tuple((cache[i], cache[i + 1]) for i in range(0, len(cache), 2))
    # Per step: every decoder weight once (cross keys/values excluded), both caches.
    bytes_read = (4.0 * (cost.layer_params + cost.head_params) + cost.cache_bytes(1, past + 1)
                  + cost.cache_bytes(1, source))
    cross_feeds = dict(zip(past_names(n, CACHE_INPUT, ENCODER),
                           [a.cpu().numpy() for pair in cross for a in pair], strict=True))
    feeds = {"input_ids": token, "encoder_attention_mask": mask, **cross_feeds,
             **dict(zip(past_names(n, CACHE_INPUT, DECODER),
                        random_cache(ctx, 1, past, numpy=True), strict=True))}

    def torch_run() -> object:
        with torch.no_grad():
            return model.decode(token_t, cross, mask_t, pairs)

    return torch_run, lambda: ctx.runtime.run("decoder.onnx", feeds), bytes_read


def _before(ctx: Context, cost: Cost, graph: Graph, source: int) -> Case:
    """The same step as the decoder graph computed it before: re-projecting the memory."""
    model = ctx.model
    memory, mask = _source(ctx, source)
    token = np.array([[5]], np.int64)
    token_t, memory_t, mask_t = (tensor(ctx, a) for a in (token, memory, mask))
    cache = random_cache(ctx, 1, STEP_PAST, numpy=False)
    pairs = tuple((cache[i], cache[i + 1]) for i in range(0, len(cache), 2))
    bytes_read = (4.0 * (cost.layer_params + cost.cross_kv_params + cost.head_params)
                  + cost.cache_bytes(1, STEP_PAST + 1) + memory.nbytes)
    feeds = {"input_ids": token, "encoder_hidden_states": memory, "encoder_attention_mask": mask,
             **dict(zip(past_names(ctx.card["n_layers"], CACHE_INPUT, DECODER),
                        random_cache(ctx, 1, STEP_PAST, numpy=True), strict=True))}

    def torch_run() -> object:
        with torch.no_grad():
            return model.decode(token_t, model.cross_cache(memory_t), mask_t, pairs)

    return torch_run, lambda: graph.run(feeds), bytes_read


def seq2seq_summary(measurements: dict[str, dict[str, Figure]]) -> dict[str, float]:
    m = measurements
    encoder = next(key for key in m if key.startswith("encoder_"))
    steps = [key for key in m if key.startswith("decode_past_")]
    sources = [key for key in m if key.startswith("decode_source_")
               and not key.endswith("_before")]
    shortest, longest = sources[0], sources[-1]
    middle = "decode_source_128" if "decode_source_128" in m else longest
    return {
        "encoder_ort_over_torch_latency": median(m, encoder, "ort") / median(m, encoder, "torch"),
        "decode_speedup_ort_over_torch": median(m, steps[-1], "torch")
        / median(m, steps[-1], "ort"),
        # the issue #12 targets: <= 1.3 and >= 1.5
        "decode_longest_over_shortest_source_ort": median(m, longest, "ort")
        / median(m, shortest, "ort"),
        "decode_source_128_speedup_over_before_ort": median(m, f"{middle}_before", "ort")
        / median(m, middle, "ort"),
    }
