"""Plugins: installed distributions with an entry point in the group `zoo.plugins`.

The entry point names a callable that receives a `PluginAPI`; through it a plugin adds card folders
and block names. Blocks are given by import path (`package.module:Class`) so that registering them
does not import torch; `zoo.blocks` imports the class only when a model is built.
"""

from __future__ import annotations

from collections.abc import Callable
from importlib.metadata import entry_points
from pathlib import Path

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
    ) -> None:
        """Register block `name` of `kind` (activation, norm, position) at `module:attr`."""
        if ":" not in target:
            raise ZooError(f"{self.origin}: block target {target!r} should be 'module:attr'")
        register_block(kind, BlockEntry(name, target, param_count, origin=self.origin))


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
