"""Names of the block kinds a card may use, known without importing torch.

Each kind is also the card field that selects a block of that kind (`norm: rmsnorm`).

The torch classes live in `zoo.blocks`; this table only knows their names, so that a card can be
validated (and `zoo list` can answer) before any tensor exists. Plugins add names here through
`registry.plugins.PluginAPI.add_block`, pointing at their class by import path, with the card
fields of their own (`fields`) and their parameter count (`param_count`), both torch-free.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from registry.errors import ZooError


@dataclass(frozen=True)
class BlockEntry:
    """A block name: either built in (target None) or a plugin's `module:attr` import path."""

    name: str
    target: str | None = None
    # Parameters one instance holds, as a function of the resolved card (plugins may omit it).
    param_count: Callable[[dict], int] | None = None
    origin: str = "built-in"
    # Card fields of the block's own, validated like the schema's and present in a resolved
    # card only when the card selects this block (so no other card changes when it is added).
    fields: Mapping[str, Any] = field(default_factory=dict)  # {name: registry.schema.Field}


def _builtin(*names: str) -> dict[str, BlockEntry]:
    return {name: BlockEntry(name) for name in names}


BLOCKS: dict[str, dict[str, BlockEntry]] = {
    "activation": _builtin("relu", "gelu", "gelu_tanh", "silu", "swiglu", "geglu",
                           "geglu_tanh"),
    "norm": _builtin("layernorm", "rmsnorm", "rmsnorm_gemma"),
    "position": _builtin("sinusoidal", "sinusoidal_halves", "learned", "rotary",
                         "t5_relative"),
}


def register_block(kind: str, entry: BlockEntry) -> None:
    """Add a block name; a second registration under one name, or a card field another block
    already declares, is an error, never an override."""
    if kind not in BLOCKS:
        raise ZooError(f"{entry.origin}: unknown block kind '{kind}' (known: {', '.join(BLOCKS)})")
    existing = BLOCKS[kind].get(entry.name)
    if existing is not None:
        raise ZooError(f"{entry.origin}: {kind} block '{entry.name}' is already registered "
                       f"by {existing.origin}")
    for name in entry.fields:
        owner = field_owner(name)
        if owner is not None:
            raise ZooError(f"{entry.origin}: card field '{name}' is already declared by "
                           f"{owner[0]} block '{owner[1].name}' ({owner[1].origin})")
    BLOCKS[kind][entry.name] = entry


def block_names(kind: str) -> list[str]:
    return sorted(BLOCKS[kind])


def field_owner(name: str) -> tuple[str, BlockEntry] | None:
    """(kind, block) of the block that declares card field `name`, if one does."""
    for kind, entries in BLOCKS.items():
        for entry in entries.values():
            if name in entry.fields:
                return kind, entry
    return None


def block_fields() -> list[str]:
    """Every card field a registered block declares."""
    return [name for entries in BLOCKS.values() for entry in entries.values()
            for name in entry.fields]
