"""`zoo bench` on an encoder: forward passes at batch 1 and 8."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from export.bench.context import Context, Figure, figure, median, tensor
from export.bench.cost import encoder_cost
from export.bench.profile import op_times, profiled_graph
from registry.catalog import Card
from runtime.contract import MODEL_GRAPH
from runtime.encode import encoder_feeds
from runtime.sessions import Runtime


def _encoder_feeds(card: Card, batch: int, length: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(batch)
    return encoder_feeds(card, rng.integers(3, card["vocab_size"], (batch, length),
                                            dtype=np.int64))


def _encoder_batch(ctx: Context, flops: float, feeds: dict[str, np.ndarray]
                   ) -> dict[str, Figure]:
    batch, length = feeds["input_ids"].shape
    tensors = [tensor(ctx, value) for value in feeds.values()]
    with torch.no_grad():
        t = ctx.time(f"forward batch {batch} x {length} (torch)", lambda: ctx.model(*tensors),
                     slow=batch > 1, torch_side=True)
    entry = {"torch": figure(t, ctx.limits["torch_flops_per_s"], flops)}
    t = ctx.time(f"forward batch {batch} x {length} (ort)",
                 lambda: ctx.runtime.run(MODEL_GRAPH, feeds), slow=batch > 1)
    entry["ort"] = entry["ort_plain"] = figure(t, ctx.limits["ort_flops_per_s"], flops)
    return entry


def bench_encoder(ctx: Context) -> dict[str, dict[str, Figure]]:
    card = ctx.card
    cost = encoder_cost(ctx.model, card)
    length = min(128, card["max_positions"])
    results = {}
    for batch in (1, 8):
        results[f"forward_b{batch}_s{length}"] = _encoder_batch(ctx, cost.encoder_forward(
            batch, length), _encoder_feeds(card, batch, length))
    return results


def encoder_summary(measurements: dict[str, dict[str, Figure]]) -> dict[str, float]:
    first = next(iter(measurements))
    return {
        "forward_b1_ort_over_torch_latency": (median(measurements, first, "ort")
                                              / median(measurements, first, "torch")),
        "forward_b1_ort_fraction_of_matmul": measurements[first]["ort"]["fraction_of_limit"],
    }


def forward_profile(runtime: Runtime, card: Card, threads: int | None, folder: Path,
                    file: str = MODEL_GRAPH) -> dict[str, dict[str, float]]:
    """Per-operator times of one 1 x 128 forward pass through `file`."""
    length = min(128, card["max_positions"])
    feeds = {"input_ids": np.full((1, length), 5), "attention_mask": np.ones((1, length),
                                                                            np.int64)}
    if file == MODEL_GRAPH:
        feeds = encoder_feeds(card, feeds["input_ids"], feeds["attention_mask"])
    graph = profiled_graph(runtime.graphs[file].path, runtime.provider, threads, folder)
    feeds = graph.in_graph_dtypes(feeds)
    return {f"{file} forward 1 x {length}": op_times(
        graph, lambda: graph.session.run(None, feeds))}
