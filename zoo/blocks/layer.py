"""One transformer layer: self-attention, optional cross-attention and feed-forward, each a
residual sublayer whose norm sits before (pre) or after (post) it, as the card says."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from torch import nn

from zoo.blocks.attention import Attention, KeyValue
from zoo.blocks.classes import build_block
from zoo.blocks.positions import Rotary
from zoo.blocks.windows import layer_is_local


class Layer(nn.Module):
    def __init__(
        self,
        self_attention: Attention,
        feed_forward: nn.Module,
        norms: list[nn.Module],
        dropout: float,
        pre_norm: bool,
        cross_attention: Attention | None = None,
        local: bool = False,
        post_norms: list[nn.Module] | None = None,
    ) -> None:
        super().__init__()
        self.local = local  # attends within the sliding window (zoo/blocks/windows.py)
        self.self_attention = self_attention
        self.cross_attention = cross_attention
        self.feed_forward = feed_forward
        self.norms = nn.ModuleList(norms)  # one per sublayer, in order
        self.dropout = nn.Dropout(dropout)
        self.pre_norm = pre_norm
        # sandwich_norm (Gemma 2, 3): one more norm per sublayer, on its output before the add
        self.post_norms = nn.ModuleList(post_norms) if post_norms else None

    # and what its blocks read
    reads = ("dropout", "norm_placement", "attention_pattern", "sandwich_norm",
             "first_attention_norm")

    @classmethod
    def from_card(cls, card: Mapping[str, Any], layer: int, cross: bool = False) -> Layer:
        """Layer `layer` of a stack: each block built from the card at this index."""
        norms = [build_block("norm", card, layer) for _ in range(3 if cross else 2)]
        if layer == 0 and not card["first_attention_norm"]:  # ModernBERT's: the embedding norm
            norms[0] = nn.Identity()
        return cls(
            self_attention=Attention.from_card(card, layer),
            feed_forward=build_block("activation", card, layer),
            norms=norms,
            dropout=card["dropout"],
            pre_norm=card["norm_placement"] == "pre",
            cross_attention=Attention.from_card(card, layer) if cross else None,
            local=layer_is_local(card, layer),
            post_norms=([build_block("norm", card, layer) for _ in range(3 if cross else 2)]
                        if card["sandwich_norm"] else None),
        )

    def _residual(self, index: int, x: torch.Tensor, sublayer) -> tuple[torch.Tensor, object]:
        norm = self.norms[index]
        if self.pre_norm:
            out, extra = sublayer(norm(x))
            if self.post_norms is not None:
                out = self.post_norms[index](out)
            return x + self.dropout(out), extra
        out, extra = sublayer(x)
        return norm(x + self.dropout(out)), extra

    def forward(
        self,
        x: torch.Tensor,
        mask: torch.Tensor | None,
        past: KeyValue | None = None,
        rotary: Rotary | None = None,
        memory: KeyValue | None = None,
        memory_mask: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, KeyValue]:
        """`memory`: the cross-attention's keys and values of the source
        (`cross_attention.project(encoder output)`), computed once per source."""
        x, present = self._residual(
            0, x, lambda h: self.self_attention(h, mask=mask, past=past, rotary=rotary)
        )
        if self.cross_attention is not None:
            x, _ = self._residual(
                1, x, lambda h: self.cross_attention(h, mask=memory_mask, past=memory,
                                                       cross=True)
            )
        x, _ = self._residual(len(self.norms) - 1, x, lambda h: (self.feed_forward(h), None))
        return x, present
