"""What every benchmark case gets (the Context: runtime, model, card, limits) and the figure
each one records.

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

from export.bench.machine import read_bandwidth
from export.bench.timing import Timing, measure
from registry.catalog import Card
from registry.sizes import cache_shape
from runtime.sessions import Runtime

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


def tensor(ctx: Context, array: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(np.ascontiguousarray(array)).to(ctx.device)


def random_cache(ctx: Context, batch: int, length: int, numpy: bool) -> list:
    card = ctx.card
    shape = cache_shape(card, batch, length)
    rng = np.random.default_rng(length)
    arrays = [rng.standard_normal(shape, np.float32) for _ in range(2 * card["n_layers"])]
    return arrays if numpy else [tensor(ctx, a) for a in arrays]


def median(measurements: dict[str, dict[str, Figure]], key: str, engine: str) -> float:
    return measurements[key][engine]["median_ms"]
