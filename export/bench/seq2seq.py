"""`zoo bench` on the encoder-decoder: the source encoder, and one decoding step at two past
lengths."""

from __future__ import annotations

import numpy as np
import torch

from export.bench.context import Context, Figure, figure, median, random_cache, tensor
from export.bench.cost import seq2seq_cost
from export.onnx.contract import CACHE_INPUT, past_names


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

    memory = rng.standard_normal((1, source, card["d_model"]), np.float32)
    # Per step the contract graph re-projects the encoder memory to cross keys/values.
    weights = 4.0 * (cost.layer_params + cost.cross_kv_params + cost.head_params)
    for past in sorted({min(p, limit - 1) for p in (16, 256)}):
        bytes_read = weights + cost.cache_bytes(1, past + 1) + memory.nbytes
        results[f"decode_past_{past}"] = _seq2seq_step(ctx, past, memory, mask, bytes_read)
    return results


def _seq2seq_step(ctx: Context, past: int, memory: np.ndarray, mask: np.ndarray,
                  bytes_read: float) -> dict[str, Figure]:
    inputs = past_names(ctx.card["n_layers"], CACHE_INPUT, ".decoder")
    token = np.array([[5]], np.int64)
    token_t, memory_t, mask_t = (tensor(ctx, a) for a in (token, memory, mask))
    cache = random_cache(ctx, 1, past, numpy=False)
    pairs = tuple((cache[i], cache[i + 1]) for i in range(0, len(cache), 2))
    bound = ctx.bound()
    with torch.no_grad():
        t = ctx.time(f"decode at past {past} (torch)",
                     lambda: ctx.model.decode(token_t, memory_t, mask_t, pairs), torch_side=True)
    entry = {"torch": figure(t, bound, bytes_read=bytes_read)}
    feeds = {"input_ids": token, "encoder_hidden_states": memory,
             "encoder_attention_mask": mask,
             **dict(zip(inputs, random_cache(ctx, 1, past, numpy=True), strict=True))}
    t = ctx.time(f"decode at past {past} (ort)", lambda: ctx.runtime.run("decoder.onnx", feeds))
    entry["ort"] = entry["ort_plain"] = figure(t, bound, bytes_read=bytes_read)
    return entry


def seq2seq_summary(measurements: dict[str, dict[str, Figure]]) -> dict[str, float]:
    keys = list(measurements)
    encoder, step = keys[0], keys[-1]
    m = measurements
    return {
        "encoder_ort_over_torch_latency": median(m, encoder, "ort") / median(m, encoder, "torch"),
        "decode_speedup_ort_over_torch": median(m, step, "torch") / median(m, step, "ort"),
    }
