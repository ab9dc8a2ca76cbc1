"""Learning-rate schedules as multipliers for torch's LambdaLR.

`noam` is the paper's lrate = d_model^-0.5 * min(step^-0.5, step * warmup^-1.5) (Vaswani et al.
2017, section 5.3), with the optimizer's lr as a factor in front (1.0 gives the paper exactly).
`cosine` warms up linearly to the optimizer's lr, then decays along a cosine to 10% of it.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
from torch.optim.lr_scheduler import LambdaLR

from registry.errors import ZooError

SCHEDULES = ("noam", "cosine")


def noam(d_model: int, warmup: int) -> Callable[[int], float]:
    def multiplier(index: int) -> float:
        step = index + 1  # LambdaLR counts from 0; the paper from 1
        return d_model**-0.5 * min(step**-0.5, step * warmup**-1.5)

    return multiplier


def warmup_cosine(warmup: int, total: int, floor: float = 0.1) -> Callable[[int], float]:
    def multiplier(index: int) -> float:
        step = index + 1
        if step <= warmup:
            return step / warmup
        progress = min(1.0, (step - warmup) / max(1, total - warmup))
        return floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * progress))

    return multiplier


def multiplier(name: str, d_model: int, warmup: int, total: int) -> Callable[[int], float]:
    """The schedule `name` as a function of LambdaLR's index (step - 1); `zoo plot schedule`
    draws the same function that training runs."""
    if warmup < 1:
        raise ZooError(f"--warmup {warmup}: should be >= 1")
    if name == "noam":
        return noam(d_model, warmup)
    if name == "cosine":
        return warmup_cosine(warmup, total)
    raise ZooError(f"--schedule {name}: expected one of {', '.join(SCHEDULES)}")


def make_scheduler(optimizer: torch.optim.Optimizer, name: str, d_model: int, warmup: int,
                   total: int) -> LambdaLR:
    return LambdaLR(optimizer, multiplier(name, d_model, warmup, total))
