"""Name-to-class tables per block kind: the built-in ones, then plugins' by import path."""

from __future__ import annotations

import importlib

from torch import nn

from registry.blocks import BLOCKS
from registry.errors import ZooError
from zoo.blocks.feedforward import FEED_FORWARDS
from zoo.blocks.norms import NORMS
from zoo.blocks.positions import POSITIONS

BUILTIN: dict[str, dict[str, type[nn.Module]]] = {
    "activation": FEED_FORWARDS,
    "norm": NORMS,
    "position": POSITIONS,
}


def block_class(kind: str, name: str) -> type[nn.Module]:
    """The class for block `name` of `kind`, importing a plugin's class on first use."""
    if name in BUILTIN[kind]:
        return BUILTIN[kind][name]
    entry = BLOCKS[kind].get(name)
    if entry is None or entry.target is None:
        raise ZooError(f"unknown {kind} block '{name}'")
    module_name, _, attribute = entry.target.partition(":")
    try:
        return getattr(importlib.import_module(module_name), attribute)
    except (ImportError, AttributeError) as exc:
        raise ZooError(f"{entry.origin}: cannot import {kind} block {entry.target}: {exc}") from exc
