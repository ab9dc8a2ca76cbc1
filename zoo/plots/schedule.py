"""`zoo plot schedule`: the learning rate against the step, one curve per warm-up (and, for the
paper's schedule, per d_model), as the Annotated Transformer draws it.

The curves are the functions training runs (`zoo.training.schedules.multiplier`) with the
defaults `zoo train` would pick for the card: its family's task, that task's schedule, warm-up
and rate (for noam a factor; 1.0 is the paper).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np

from registry.catalog import Card
from registry.errors import ZooError
from zoo.plots.draw import Chart, Drawn, Line, check_target, line_charts
from zoo.training.schedules import multiplier
from zoo.training.tasks import TrainOptions, default_task

STEPS_PER_WARMUP = 5  # default length: the peak and a good part of the decay


def training_defaults(card: Card, schedule: str | None, lr: float | None) -> TrainOptions:
    """What `zoo train` would use for this card: its task's schedule, warm-up and rate."""
    return TrainOptions(task=default_task(card), out=Path(), schedule=schedule, lr=lr
                        ).resolved(card)


def schedule_lines(card: Card, schedule: str | None = None, warmups: Sequence[int] = (),
                   d_models: Sequence[int] = (), steps: int | None = None,
                   lr: float | None = None) -> tuple[str, list[Line]]:
    """The schedule's name and its curves: the rate used at each step 1..steps."""
    defaults = training_defaults(card, schedule, lr)
    warmups = list(dict.fromkeys(warmups)) or [defaults.warmup]
    if d_models and defaults.schedule != "noam":
        raise ZooError(f"--d-model: the {defaults.schedule} schedule does not depend on d_model "
                       "(only noam does)")
    d_models = list(dict.fromkeys(d_models)) or [card["d_model"]]
    for name, values in (("--warmup", warmups), ("--d-model", d_models)):
        for value in values:
            if value < 1:
                raise ZooError(f"{name} {value}: should be >= 1")
    steps = steps if steps is not None else STEPS_PER_WARMUP * max(warmups)
    if steps < 1:
        raise ZooError(f"--steps {steps}: should be >= 1")
    if max(warmups) > steps:
        raise ZooError(f"--warmup {max(warmups)} is longer than --steps {steps}: the peak "
                       "would not be drawn")
    indices = np.arange(steps)  # LambdaLR's index; the step is index + 1
    lines = []
    for d_model in d_models:
        for warmup in warmups:
            rate = multiplier(defaults.schedule, d_model, warmup, steps)
            label = f"warmup {warmup}"
            if defaults.schedule == "noam":
                label = f"d_model {d_model}, {label}"
            lines.append(Line(indices + 1, defaults.lr * np.array([rate(i) for i in indices]),
                              label))
    return defaults.schedule, lines


def plot_schedule(card: Card, target: Path, force: bool = False, schedule: str | None = None,
                  warmups: Sequence[int] = (), d_models: Sequence[int] = (),
                  steps: int | None = None, lr: float | None = None) -> Drawn:
    check_target(target, force)
    name, lines = schedule_lines(card, schedule, warmups, d_models, steps, lr)
    chart = Chart(lines, f"{card.name}: {name} schedule", x_title="step",
                  y_title="learning rate")
    return line_charts([chart], target, force=force)
