"""Where a model comes from: a folder holding config.yaml (built, trained or imported), or a
card name to build with a seed."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from torch import nn

from registry.catalog import Card, open_catalog
from zoo.build import build_model
from zoo.files.weights import CONFIG, load_built


def load_source(source: str, registries: tuple[str, ...] | list[str] = (), seed: int = 0,
                overrides: dict[str, Any] | None = None) -> tuple[nn.Module, Card]:
    folder = Path(source)
    if (folder / CONFIG).is_file():
        return load_built(folder)
    card = open_catalog(registries).get(source, overrides)
    return build_model(card, seed=seed), card
