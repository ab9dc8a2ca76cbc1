"""Names of the block kinds a card may use, known without importing torch.

Each kind is also the card field that selects a block of that kind (`norm: rmsnorm`).

The torch classes live in `zoo.blocks`; this table only knows their names, so that a card can be
validated (and `zoo list` can answer) before any tensor exists. Plugins add names here through
`registry.plugins.PluginAPI.add_block`, pointing at their class by import path.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from registry.errors import ZooError


@dataclass(frozen=True)
class BlockEntry:
    """A block name: either built in (target None) or a plugin's `module:attr` import path."""

    name: str
    target: str | None = None
    # Parameters one instance holds, as a function of the resolved card (plugins may omit it).
    param_count: Callable[[dict], int] | None = None
    origin: str = "built-in"


def _builtin(*names: str) -> dict[str, BlockEntry]:
    return {name: BlockEntry(name) for name in names}


BLOCKS: dict[str, dict[str, BlockEntry]] = {
    "activation": _builtin("relu", "gelu", "gelu_tanh", "silu", "swiglu"),
    "norm": _builtin("layernorm", "rmsnorm"),
    "position": _builtin("sinusoidal", "sinusoidal_halves", "learned", "rotary"),
}


def register_block(kind: str, entry: BlockEntry) -> None:
    """Add a block name; a second registration under one name is an error, never an override."""
    if kind not in BLOCKS:
        raise ZooError(f"{entry.origin}: unknown block kind '{kind}' (known: {', '.join(BLOCKS)})")
    existing = BLOCKS[kind].get(entry.name)
    if existing is not None:
        raise ZooError(f"{entry.origin}: {kind} block '{entry.name}' is already registered "
                       f"by {existing.origin}")
    BLOCKS[kind][entry.name] = entry


def block_names(kind: str) -> list[str]:
    return sorted(BLOCKS[kind])
