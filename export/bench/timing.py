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


def measure_interleaved(runs: dict[str, Callable[[], object]], repeats: int, warmup: int = 3
                        ) -> dict[str, Timing]:
    """Time several cases in rounds, one run of each per round, so a load that drifts while
    they run (these machines are shared) weighs on every case alike; ratios between them
    then mean what they say."""
    seconds: dict[str, list[float]] = {name: [] for name in runs}
    for index in range(warmup + repeats):
        for name, run in runs.items():
            start = time.perf_counter()
            run()
            if index >= warmup:
                seconds[name].append(time.perf_counter() - start)
    return {name: Timing(values) for name, values in seconds.items()}
