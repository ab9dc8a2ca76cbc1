"""Plugins: installed distributions with an entry point in the group `zoo.plugins`.

The entry point names a callable that receives a `PluginAPI`; through it a plugin adds card folders
and blocks: a name of a kind, its class by import path (`package.module:Class`, so that
registering it does not import torch; `zoo.blocks` imports the class only when a model is built),
its parameter count and its own card fields (`registry.schema.Field`s). The class is built as
`Class.from_card(card, layer)` (zoo/blocks/classes.py).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from importlib.metadata import entry_points
from pathlib import Path
from typing import Any

from registry.blocks import BlockEntry, register_block
from registry.errors import ZooError, first_line

GROUP = "zoo.plugins"


class PluginAPI:
    def __init__(self, origin: str) -> None:
        self.origin = origin
        self.card_folders: list[Path] = []

    def add_cards(self, folder: str | Path) -> None:
        folder = Path(folder)
        if not folder.is_dir():
            raise ZooError(f"{self.origin}: card folder {folder} does not exist")
        self.card_folders.append(folder)

    def add_block(
        self,
        kind: str,
        name: str,
        target: str,
        param_count: Callable[[dict], int] | None = None,
        fields: Mapping[str, Any] | None = None,
    ) -> None:
        """Register block `name` of `kind` (activation, norm, position) at `module:attr`.

        `param_count(card)`: the parameters one instance holds (torch-free: `zoo list`);
        `fields`: card fields of the block's own, {name: Field(type, default, ...)}, validated
        like the schema's and resolved only in cards that select this block."""
        if ":" not in target:
            raise ZooError(f"{self.origin}: block target {target!r} should be 'module:attr'")
        register_block(kind, BlockEntry(name, target, param_count, origin=self.origin,
                                        fields=dict(fields or {})))


_loaded: list[Path] | None = None


def load_plugins() -> list[Path]:
    """Run every plugin once per process; return the card folders they added."""
    global _loaded
    if _loaded is not None:
        return _loaded
    folders: list[Path] = []
    for point in sorted(entry_points(group=GROUP), key=lambda ep: ep.name):
        dist = point.dist.name if point.dist else "?"
        api = PluginAPI(f"plugin '{point.name}' ({dist})")
        try:
            point.load()(api)
        except ZooError:
            raise
        except Exception as exc:  # a broken plugin must not become a traceback
            raise ZooError(f"{api.origin} failed to load: {type(exc).__name__}: "
                           f"{first_line(exc, default='')}") from exc
        folders.extend(api.card_folders)
    _loaded = folders
    return folders
