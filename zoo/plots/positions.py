"""`zoo plot positions`: a model's position table as a heatmap, position x dimension.

The numbers come from the model's own position block through its two hooks, so any block draws
(a plugin's too): what `add` adds to the embeddings (the paper's sinusoids, a learned table),
and for rotary blocks the angles theta = position * inv_freq that rotate queries and keys,
beside their cosines as attention uses them.
"""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

from registry.catalog import Card
from registry.errors import ZooError
from zoo.blocks.embeddings import Embeddings
from zoo.files.sources import load_source
from zoo.plots.draw import Drawn, Panel, check_target, heatmap_grid


def position_block(model: nn.Module) -> nn.Module:
    """The position block: every family hands one to its (first) embeddings."""
    for module in model.modules():
        if isinstance(module, Embeddings):
            return module.position
    raise ZooError(f"{type(model).__name__}: found no embeddings with a position block")


@torch.no_grad()
def position_panels(model: nn.Module, card: Card, count: int) -> list[Panel]:
    position = position_block(model)
    ids = torch.arange(count)[None]  # (1, P)
    rotary = position.rotary(ids)
    table = position.add(torch.zeros(1, count, card["d_model"]), ids)[0]  # (P, d)
    panels = []
    if rotary is None or table.abs().max() > 0:
        panels.append(Panel(table.double().numpy(), f"{card['position']}: added to the "
                            "embeddings", x_title="dimension", y_title="position", cmap="RdBu"))
    if rotary is not None:
        inv_freq = getattr(position, "inv_freq", None)
        if inv_freq is None:
            raise ZooError(f"{card.name}: position '{card['position']}' has no inv_freq, so "
                           "its rotation angles cannot be drawn")
        half = inv_freq.numel()  # rotary() repeats the angles for both halves of a head
        angle = ids[0, :, None].double() * inv_freq.double()  # (P, hd/2)
        panels.append(Panel(angle.numpy(), "rotary angle θ = position × inv_freq (radians)",
                            x_title="frequency i", y_title="position"))
        panels.append(Panel(rotary[0][0, 0, :, :half].double().numpy(), "cos θ (queries, keys)",
                            x_title="frequency i", y_title="position", cmap="RdBu"))
    return panels


def plot_positions(source: str, target: Path, force: bool = False,
                   registries: tuple[str, ...] = (), positions: int | None = None) -> Drawn:
    """Draw the position table of card `source` (built with seed 0) or of a model folder."""
    check_target(target, force)  # before building: bad input costs nothing
    if positions is not None and positions < 1:
        raise ZooError(f"--positions {positions}: should be >= 1")
    model, card = load_source(source, registries, seed=0)
    count = card["max_positions"] if positions is None else positions
    if count > card["max_positions"]:
        raise ZooError(f"--positions {count}: should be 1 to {card['max_positions']} "
                       f"(max_positions of {card.name})")
    return heatmap_grid(position_panels(model, card, count), target, force=force,
                        title=f"{card.name}: positions 0-{count - 1}")
