"""`zoo bench` on an image model (a ViT): forward passes at batch 1 and 8 through PyTorch eager
(the zoo's model), ONNX Runtime, and transformers' ViTForImageClassification in the same run.

transformers' model is built from the export's own config.json (the file transformers.js and
Optimum read) with its own random weights: the same shapes, so the same work (dense fp32 time
does not depend on the values; the weights' equality is the import tests' business). Its
attention is transformers' default (`sdpa`), as a user of the class gets it. Without
transformers installed the figures are the zoo's two engines'.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from export.bench.context import Context, Figure, figure, median, tensor
from export.bench.cost import encoder_cost
from export.bench.profile import op_times, profiled_graph
from registry.catalog import Card
from registry.stems import num_patches
from runtime.contract import MODEL_GRAPH
from runtime.sessions import Runtime

BATCHES = (1, 8)
TRANSFORMERS = "transformers"  # the engine's name in the figures


def transformers_model(ctx: Context) -> torch.nn.Module | None:
    """ViTForImageClassification (ViTModel without a classifier) from the export's config.json,
    or None without transformers."""
    try:
        import transformers
    except ImportError:
        return None
    config = transformers.AutoConfig.from_pretrained(ctx.runtime.folder)
    kind = (transformers.ViTForImageClassification if ctx.card["num_labels"]
            else transformers.ViTModel)
    return kind(config).eval().to(ctx.device)


def _images(figures: Figure, batch: int) -> Figure:
    return {**figures, "images_per_s": batch * 1000 / figures["median_ms"]}


def _image_batch(ctx: Context, reference: torch.nn.Module | None, batch: int, flops: float
                 ) -> dict[str, Figure]:
    side = ctx.card["image_size"]
    pixels = np.random.default_rng(batch).standard_normal(
        (batch, ctx.card["channels"], side, side)).astype(np.float32)
    values = tensor(ctx, pixels)
    label, slow = f"forward batch {batch} x {side}x{side}", batch > 1
    torch_limit = ctx.limits["torch_flops_per_s"]
    with torch.no_grad():
        t = ctx.time(f"{label} (torch)", lambda: ctx.model(values), slow=slow, torch_side=True)
        entry = {"torch": _images(figure(t, torch_limit, flops), batch)}
        if reference is not None:
            t = ctx.time(f"{label} ({TRANSFORMERS})", lambda: reference(pixel_values=values),
                         slow=slow, torch_side=True)
            entry[TRANSFORMERS] = _images(figure(t, torch_limit, flops), batch)
    t = ctx.time(f"{label} (ort)", lambda: ctx.runtime.run(MODEL_GRAPH, {"pixel_values": pixels}),
                 slow=slow)
    entry["ort"] = _images(figure(t, ctx.limits["ort_flops_per_s"], flops), batch)
    return entry


def bench_image(ctx: Context) -> dict[str, dict[str, Figure]]:
    cost = encoder_cost(ctx.model, ctx.card)  # the layers' FLOPs (the patch projection aside)
    length = num_patches(ctx.card) + 1  # the class token and the patches
    reference = transformers_model(ctx)
    return {f"forward_b{batch}_{ctx.card['image_size']}px": _image_batch(
        ctx, reference, batch, cost.encoder_forward(batch, length)) for batch in BATCHES}


def image_summary(measurements: dict[str, dict[str, Figure]]) -> dict[str, float]:
    """Images per second at the largest batch, per engine, and ONNX Runtime's latency at
    batch 1 over each PyTorch side's."""
    first, last = next(iter(measurements)), list(measurements)[-1]
    result = {f"{last}_{engine}_images_per_s": figures["images_per_s"]
              for engine, figures in measurements[last].items()}
    for engine in ("torch", TRANSFORMERS):
        if engine in measurements[first]:
            result[f"{first}_ort_over_{engine}_latency"] = (
                median(measurements, first, "ort") / median(measurements, first, engine))
    return result


def image_profile(runtime: Runtime, card: Card, threads: int | None, folder: Path
                  ) -> dict[str, dict[str, float]]:
    """Per-operator times of one forward pass of one image."""
    side = card["image_size"]
    graph = profiled_graph(runtime.graphs[MODEL_GRAPH].path, runtime.provider, threads, folder)
    feeds = graph.in_graph_dtypes(
        {"pixel_values": np.zeros((1, card["channels"], side, side), np.float32)})
    return {f"{MODEL_GRAPH} forward 1 x {side}x{side}": op_times(
        graph, lambda: graph.session.run(None, feeds))}
