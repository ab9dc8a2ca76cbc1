"""Wall-clock timing for the benchmark: warm-up runs first, then repeated runs summarised by the
median and the spread (p10-p90, min-max), so one slow run on a busy machine does not decide."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np


@dataclass
class Timing:
    seconds: list[float]

    @property
    def median(self) -> float:
        return float(np.median(self.seconds))

    def as_dict(self) -> dict[str, float]:
        s = np.asarray(self.seconds)
        return {"median_ms": 1e3 * float(np.median(s)), "p10_ms": 1e3 * float(np.percentile(s, 10)),
                "p90_ms": 1e3 * float(np.percentile(s, 90)), "min_ms": 1e3 * float(s.min()),
                "max_ms": 1e3 * float(s.max()), "runs": float(len(s))}


def measure(run: Callable[[], object], repeats: int, warmup: int = 3,
            setup: Callable[[], object] | None = None,
            sync: Callable[[], object] | None = None) -> Timing:
    """Time `run` `repeats` times after `warmup` untimed runs; `setup` (untimed) runs before
    each call, `sync` (timed) after it, e.g. torch.cuda.synchronize."""
    seconds = []
    for index in range(warmup + repeats):
        if setup is not None:
            setup()
        start = time.perf_counter()
        run()
        if sync is not None:
            sync()
        if index >= warmup:
            seconds.append(time.perf_counter() - start)
    return Timing(seconds)
