"""matplotlib helpers: a grid of heatmaps, stacked line charts, and PNG files written atomically.

Figures are `matplotlib.figure.Figure` objects rendered by the Agg backend, never pyplot's
global figure list: no display is needed and nothing leaks between calls. Their size is fixed
in inches at a fixed dpi, so a PNG's size in pixels is known in advance. Each draw function
returns a `Drawn` read back from matplotlib's artists (the arrays in the images, the points of
the lines), so a test compares what the picture holds with the model's own numbers.
"""

from __future__ import annotations

import io
import math
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")  # before anything imports pyplot: servers and CI have no display

import numpy as np  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402

from registry.errors import ZooError  # noqa: E402
from registry.paths import display_path  # noqa: E402
from runtime.files.atomic import refuse_existing, write_file  # noqa: E402

DPI = 100
HEATMAP_SIZE = (4.0, 3.5)  # inches per heatmap panel (with its colour bar)
CHART_SIZE = (8.0, 3.0)  # inches per line-chart panel


@dataclass(frozen=True)
class Panel:
    """One heatmap: `values` (rows, columns), drawn with row 0 at the top."""

    values: np.ndarray
    title: str = ""
    x_labels: Sequence[str] | None = None  # one per column (e.g. key tokens); None: numbers
    y_labels: Sequence[str] | None = None  # one per row (e.g. query tokens)
    x_title: str = ""
    y_title: str = ""
    cmap: str = "viridis"
    # an (H, W, 3) picture under the heatmap, which is stretched over it (half transparent)
    background: np.ndarray | None = None


@dataclass(frozen=True)
class Line:
    x: np.ndarray
    y: np.ndarray
    label: str = ""


@dataclass(frozen=True)
class Chart:
    """One line-chart panel."""

    lines: Sequence[Line]
    title: str = ""
    x_title: str = ""
    y_title: str = ""
    log_y: bool = False


@dataclass(frozen=True)
class Drawn:
    """What a PNG holds, read back from the figure."""

    path: Path
    size: tuple[int, int]  # (width, height) in pixels
    panels: int  # panels with data (colour bars and empty grid cells not counted)
    images: list[np.ndarray] = field(default_factory=list)  # heatmaps, panel by panel
    lines: list[dict[str, tuple[np.ndarray, np.ndarray]]] = field(default_factory=list)
    # line charts, panel by panel: label -> (x, y)


def check_target(target: Path, force: bool) -> None:
    """Refuse a PNG path that cannot be written, before any work: one line, nothing created."""
    target = Path(target)
    if target.suffix.lower() != ".png":
        raise ZooError(f"{display_path(target)}: expected a .png file name")
    if target.is_dir():
        raise ZooError(f"{display_path(target)} is a folder; expected a .png file name")
    refuse_existing(target, force)
    folder = target.parent
    while not folder.exists() and folder != folder.parent:
        folder = folder.parent  # missing folders are made, in the nearest existing one
    if not folder.is_dir():
        raise ZooError(f"{display_path(target)}: {display_path(folder)} is not a folder")
    if not os.access(folder, os.W_OK | os.X_OK):
        raise ZooError(f"{display_path(target)}: {display_path(folder)} is not writable")


def save_png(figure: Figure, target: Path, force: bool) -> tuple[int, int]:
    """Render and write `figure` atomically; returns its (width, height) in pixels."""
    check_target(target, force)
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=DPI)  # no bbox "tight": the size stays fixed
    try:  # not over a PNG made since check_target without force; a second run's one line
        write_file(target, buffer.getvalue(), force)
    except OSError as exc:
        raise ZooError(f"{display_path(target)}: cannot write: {exc.strerror or exc}") from exc
    width, height = figure.get_size_inches() * DPI
    return round(width), round(height)


def square_columns(count: int) -> int:
    """Columns of an about-square grid of `count` panels (9: 3 x 3, 12: 4 columns x 3 rows):
    a long row of panels is shrunk by a screen into an unreadable strip."""
    return math.ceil(math.sqrt(count))


def heatmap_grid(panels: Sequence[Panel], target: Path, *, force: bool = False,
                 title: str = "", columns: int | None = None,
                 shared_scale: bool = False) -> Drawn:
    """Draw `panels` as heatmaps in a grid (`columns` wide, at most 4 by default) into the PNG
    `target`, each with a colour bar, or one colour bar for all when `shared_scale`."""
    if not panels:
        raise ValueError("heatmap_grid needs at least one panel")
    check_target(target, force)
    columns = columns or min(len(panels), 4)
    rows = math.ceil(len(panels) / columns)
    figure = Figure(figsize=(HEATMAP_SIZE[0] * columns, HEATMAP_SIZE[1] * rows), dpi=DPI,
                    layout="constrained")
    axes = figure.subplots(rows, columns, squeeze=False).flatten()
    for unused in axes[len(panels):]:
        unused.remove()
    scale = {}
    if shared_scale:
        scale = {"vmin": min(float(np.min(p.values)) for p in panels),
                 "vmax": max(float(np.max(p.values)) for p in panels)}
    images = []
    for axis, panel in zip(axes, panels, strict=False):
        image = _heatmap(axis, panel, scale)
        images.append(image)
        axis.set_title(panel.title, fontsize=9)
        axis.set_xlabel(panel.x_title)
        axis.set_ylabel(panel.y_title)
        if panel.x_labels is not None:
            axis.set_xticks(range(len(panel.x_labels)), panel.x_labels, rotation=90, fontsize=7)
        if panel.y_labels is not None:
            axis.set_yticks(range(len(panel.y_labels)), panel.y_labels, fontsize=7)
        if not shared_scale:
            figure.colorbar(image, ax=axis)
    if shared_scale:
        figure.colorbar(images[-1], ax=list(axes[:len(panels)]))
    if title:
        figure.suptitle(title)
    size = save_png(figure, Path(target), force)
    drawn = [axis for axis in figure.axes if axis.images]
    return Drawn(Path(target), size, len(drawn),
                 images=[np.asarray(axis.images[-1].get_array()) for axis in drawn])


def _heatmap(axis: Any, panel: Panel, scale: dict[str, float]) -> Any:
    """The panel's values as an image; over its background, each cell stretched over the
    pixels it stands for (a ViT's patch grid over the image) and half transparent."""
    if panel.background is None:
        return axis.imshow(np.asarray(panel.values), aspect="auto", cmap=panel.cmap,
                           interpolation="nearest", **scale)
    height, width = panel.background.shape[:2]
    axis.imshow(panel.background, extent=(0, width, height, 0))
    return axis.imshow(np.asarray(panel.values), extent=(0, width, height, 0), alpha=0.6,
                       cmap=panel.cmap, interpolation="nearest", **scale)


def line_charts(charts: Sequence[Chart], target: Path, *, force: bool = False,
                title: str = "") -> Drawn:
    """Draw `charts` stacked one above the other into the PNG `target`; a chart with more than
    one line gets a legend."""
    if not charts:
        raise ValueError("line_charts needs at least one chart")
    check_target(target, force)
    figure = Figure(figsize=(CHART_SIZE[0], CHART_SIZE[1] * len(charts)), dpi=DPI,
                    layout="constrained")
    axes = figure.subplots(len(charts), 1, squeeze=False)[:, 0]
    for axis, chart in zip(axes, charts, strict=True):
        for line in chart.lines:
            axis.plot(np.asarray(line.x), np.asarray(line.y), label=line.label, linewidth=1.2)
        axis.set_title(chart.title, fontsize=10)
        axis.set_xlabel(chart.x_title)
        axis.set_ylabel(chart.y_title)
        if chart.log_y:
            axis.set_yscale("log")
        axis.grid(alpha=0.3)
        if len(chart.lines) > 1:
            axis.legend(fontsize=8)
    if title:
        figure.suptitle(title)
    size = save_png(figure, Path(target), force)
    drawn = [axis for axis in figure.axes if axis.get_lines()]
    return Drawn(Path(target), size, len(drawn), lines=[
        {line.get_label(): (np.asarray(line.get_xdata()), np.asarray(line.get_ydata()))
         for line in axis.get_lines()} for axis in drawn])
