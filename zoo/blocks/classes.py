"""`block_class`: a block's class, found by the import path its declaration gives
(registry/blocks.py: the built-in ones and plugins' alike), and `build_block`: every
selectable block is built from the validated card and its layer index.

A block class declares `reads` (the card fields it reads; tests/zoo/test_block_fields.py checks the
built-in ones) and builds itself with `from_card(card, layer)`, `layer` None outside the layers
(the embeddings' position, the final norm). A per-layer pattern (local and global attention,
dense and mixture-of-experts layers) is then a card field the block reads at its index, not code
in zoo/assemble.py. A plugin class without `from_card`, written for the fixed constructors of
before (`Norm(d_model, eps)`, `FFN(d_model, d_ff, dropout, bias)`, `Position(d_model,
max_positions, head_dim, theta)`), is still built that way.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from typing import Any

from torch import nn

from registry.blocks import BLOCKS, BUILT_IN, effective_bias
from registry.errors import ZooError
from registry.sizes import attention_sizes

Card = Mapping[str, Any]
# The fixed constructors before `from_card`, for plugin classes that predate it.
FIXED: dict[str, Callable[..., nn.Module]] = {
    "norm": lambda cls, card, size=None: cls(size or card["d_model"], card["norm_eps"]),
    "activation": lambda cls, card: cls(card["d_model"], card["d_ff"], card["dropout"],
                                        effective_bias(card, "mlp_bias")),
    "position": lambda cls, card: cls(card["d_model"], card["max_positions"],
                                      attention_sizes(card).head_dim, card["rope_theta"]),
}


def block_class(kind: str, name: str) -> type[nn.Module]:
    """The class for block `name` of `kind`, imported on first use from where its declaration
    (registry/blocks.py, or a plugin's) says it lives."""
    entry = BLOCKS[kind].get(name)
    if entry is None or entry.target is None:
        raise ZooError(f"unknown {kind} block '{name}'")
    module_name, _, attribute = entry.target.partition(":")
    try:
        return getattr(importlib.import_module(module_name), attribute)
    except (ImportError, AttributeError) as exc:
        if entry.origin == BUILT_IN:  # the zoo's own bug: a traceback, not a user's exit 2
            raise
        raise ZooError(f"{entry.origin}: cannot import {kind} block {entry.target}: {exc}") from exc


def build_block(kind: str, card: Card, layer: int | None, **role: Any) -> nn.Module:
    """The block the card selects for `kind` (`card[kind]`), for layer `layer`. `role`: what a
    kind's blocks take besides (a norm's `size`, for the per-head query/key norms)."""
    cls = block_class(kind, card[kind])
    from_card = getattr(cls, "from_card", None)
    if from_card is not None:
        return from_card(card, layer, **role)
    return FIXED[kind](cls, card, **role)
