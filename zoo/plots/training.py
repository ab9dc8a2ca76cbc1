"""`zoo plot training`: loss and learning rate against the step, from OUT/metrics.jsonl."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from registry.paths import display_path
from zoo.plots.draw import Chart, Drawn, Line, check_target, line_charts
from zoo.training.metrics import read_metrics


def plot_training(out: Path, target: Path, force: bool = False) -> Drawn:
    check_target(target, force)
    records = read_metrics(out)
    steps = np.array([record["step"] for record in records])
    loss = np.array([record["loss"] for record in records], dtype=np.float64)
    lr = np.array([record["lr"] for record in records], dtype=np.float64)
    return line_charts([
        Chart([Line(steps, loss, "loss")], "training loss", x_title="step", y_title="loss"),
        Chart([Line(steps, lr, "lr")], "learning rate", x_title="step", y_title="lr"),
    ], target, force=force, title=display_path(out))
