"""Local (sliding-window) attention beside global attention, layer by layer.

A card's `attention_pattern` is cycled over the layers: "G" a global layer, "L" a local one
("LLLLLG" is Gemma 3's five local to one global, "LG" Gemma 2's, "GLL" ModernBERT's). A local
layer attends within `sliding_window`: in a causal stack a query sees itself and the
`sliding_window - 1` tokens before it (transformers' sliding_window_overlay, Gemma); in a
bidirectional one it sees `sliding_window // 2` tokens on either side (ModernBERT's
`local_attention`). Local layers may rotate with a base of their own (`rope_theta_local`).

The model builds both masks and both rotary tables once per forward, and each layer takes the
pair of its kind: a card without local layers runs, and traces, exactly as before.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from torch import nn

from registry.sizes import attention_sizes
from zoo.blocks.attention import build_mask, with_position_bias
from zoo.blocks.positions import Rotary, RotaryPositions

Card = Mapping[str, Any]


def layer_is_local(card: Card, layer: int | None) -> bool:
    """Whether layer `layer` attends within the sliding window (the pattern cycled)."""
    pattern = card["attention_pattern"]
    return layer is not None and pattern[layer % len(pattern)] == "L"


def has_local_layers(card: Card) -> bool:
    return any(layer_is_local(card, index) for index in range(card["n_layers"]))


class LocalAttention(nn.Module):
    """What the local layers attend with: the window, and their own rotary table where the
    card gives them a base of their own (no parameters; its frequencies are not saved)."""

    reads = ("attention_pattern", "sliding_window", "rope_theta_local", "d_model",
             "max_positions", "n_heads", "head_dim")

    def __init__(self, window: int, rotary: RotaryPositions | None = None) -> None:
        super().__init__()
        self.window = window
        self.rotary = rotary

    @classmethod
    def from_card(cls, card: Card) -> LocalAttention | None:
        """None for a card without local layers."""
        if not has_local_layers(card):
            return None
        theta = card["rope_theta_local"]
        rotary = None if theta is None else RotaryPositions(
            card["d_model"], card["max_positions"], attention_sizes(card).head_dim, theta)
        return cls(card["sliding_window"], rotary)

    def context(self, position: nn.Module, key_padding: torch.Tensor | None, query_length: int,
                key_length: int, causal: bool, position_ids: torch.Tensor,
                global_rotary: Rotary | None, dtype: torch.dtype
                ) -> tuple[torch.Tensor | None, Rotary | None]:
        """The local layers' mask (with the position block's bias, as the global one) and
        rotary table."""
        mask = build_mask(key_padding, query_length, key_length, causal=causal,
                          device=position_ids.device, dtype=dtype, window=self.window)
        mask = with_position_bias(position, mask, query_length, key_length)
        rotary = global_rotary if self.rotary is None else self.rotary.rotary(position_ids)
        return mask, rotary
