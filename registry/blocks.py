"""The block kinds a card may use, each built-in block declared once: its name, its class (by
import path, resolved in zoo/blocks/classes.py as a plugin's is) and its parameter count.

Each kind is also the card field that selects a block of that kind (`norm: rmsnorm`). This
table is torch-free, so that a card can be validated and counted (and `zoo list` can answer)
before any tensor exists. Plugins add names here through `registry.plugins.PluginAPI.add_block`
the same way, with the card fields of their own (`fields`) and their count (`param_count`). No
block name is spelled outside its declaration: code that must name one imports the constant
(tests/house/test_structure.py checks it).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from registry.errors import ZooError
from registry.families import SPECS
from registry.sizes import attention_sizes

BUILT_IN = "built-in"  # the origin of the blocks declared here and in registry/experts.py


@dataclass(frozen=True)
class BlockEntry:
    """A block name and its class's `module:attr` import path (built in or a plugin's)."""

    name: str
    target: str | None = None
    # Parameters one instance holds, as a function of the resolved card (plugins may omit it).
    param_count: Callable[[dict], int] | None = None
    origin: str = BUILT_IN
    # Card fields of the block's own, validated like the schema's and present in a resolved
    # card only when the card selects this block (so no other card changes when it is added).
    fields: Mapping[str, Any] = field(default_factory=dict)  # {name: registry.schema.Field}


def effective_bias(card: Any, field: str) -> bool:
    """`attention_bias` or `mlp_bias` as built: null (or absent, in older cards) follows
    `bias`."""
    try:
        value = card[field]
    except KeyError:
        value = None
    return card["bias"] if value is None else value


def key_bias(card: Any) -> bool:
    """Whether the key projection has a bias as built: `key_bias`, null (or absent) follows
    the query and value projections' (`attention_bias`)."""
    try:
        value = card["key_bias"]
    except KeyError:
        value = None
    return effective_bias(card, "attention_bias") if value is None else value


def layernorm_params(card: Mapping[str, Any]) -> int:
    return 2 * card["d_model"] if card.get("norm_bias", True) else card["d_model"]


def scale_params(card: Mapping[str, Any]) -> int:  # an RMS norm: one scale per channel
    return card["d_model"]


def two_matrices(card: Mapping[str, Any]) -> int:  # up, activation, down
    d, f = card["d_model"], card["d_ff"]
    return 2 * d * f + (f + d if effective_bias(card, "mlp_bias") else 0)


def three_matrices(card: Mapping[str, Any]) -> int:  # gate, up, down
    d, f = card["d_model"], card["d_ff"]
    return 3 * d * f + (2 * f + d if effective_bias(card, "mlp_bias") else 0)


def learned_params(card: Mapping[str, Any]) -> int:
    return card["max_positions"] * card["d_model"]


def no_params(card: Mapping[str, Any]) -> int:
    return 0


def relative_bias_params(card: Mapping[str, Any]) -> int:  # T5's: a table per stack
    stacks = len(SPECS[card["family"]].stacks)
    return stacks * card["relative_buckets"] * attention_sizes(card).heads


GELU, GELU_TANH, SWIGLU, GEGLU = "gelu", "gelu_tanh", "swiglu", "geglu"
LAYERNORM = "layernorm"
LEARNED, ROTARY = "learned", "rotary"


def _declared(*entries: tuple[str, str, Callable[[Mapping[str, Any]], int]]
              ) -> dict[str, BlockEntry]:
    """Built-in blocks of one kind: (name, `module:Class` under zoo/blocks/, count)."""
    return {name: BlockEntry(name, f"zoo.blocks.{path}", count) for name, path, count in entries}


BLOCKS: dict[str, dict[str, BlockEntry]] = {
    "activation": _declared(
        ("relu", "feedforward:ReluFeedForward", two_matrices),
        (GELU, "feedforward:GeluFeedForward", two_matrices),
        (GELU_TANH, "feedforward:GeluTanhFeedForward", two_matrices),
        ("silu", "feedforward:SiluFeedForward", two_matrices),
        ("quick_gelu", "feedforward:QuickGeluFeedForward", two_matrices),
        (SWIGLU, "feedforward:SwiGLUFeedForward", three_matrices),
        (GEGLU, "feedforward:GeGLUFeedForward", three_matrices),
        ("geglu_tanh", "feedforward:GeGLUTanhFeedForward", three_matrices)),
    "norm": _declared(
        (LAYERNORM, "norms:LayerNorm", layernorm_params),
        ("rmsnorm", "norms:RMSNorm", scale_params),
        ("rmsnorm_gemma", "norms:GemmaRMSNorm", scale_params)),
    "position": _declared(
        ("sinusoidal", "positions:Sinusoidal", no_params),
        ("sinusoidal_halves", "positions:SinusoidalHalves", no_params),
        (LEARNED, "positions:Learned", learned_params),
        (ROTARY, "positions:RotaryPositions", no_params),
        ("t5_relative", "relative_bias:T5RelativeBias", relative_bias_params)),
    "stem": {},  # registry/stems.py: the token embeddings and a ViT's patches
}


def register_block(kind: str, entry: BlockEntry) -> None:
    """Add a block name; a second registration under one name, or a card field another block
    already declares, is an error, never an override."""
    if kind not in BLOCKS:
        raise ZooError(f"{entry.origin}: unknown block kind '{kind}' (known: {', '.join(BLOCKS)})")
    if not entry.target:
        raise ZooError(f"{entry.origin}: {kind} block '{entry.name}' names no class "
                       "('module:Class')")
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
