"""BERT-style encoder: token, position and token-type embeddings, layers, pooler, MLM head."""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import nn

from zoo.blocks.attention import build_mask, padded_positions
from zoo.blocks.embeddings import Embeddings
from zoo.blocks.heads import MLMHead, Pooler
from zoo.blocks.layer import Layer


class EncoderOutput(NamedTuple):
    last_hidden_state: torch.Tensor  # (B, T, d)
    pooler_output: torch.Tensor | None  # (B, d)
    logits: torch.Tensor | None  # (B, T, vocab), the MLM predictions


class Encoder(nn.Module):
    def __init__(
        self,
        embeddings: Embeddings,
        layers: list[Layer],
        final_norm: nn.Module | None,
        pooler: Pooler | None,
        mlm_head: MLMHead | None,
    ) -> None:
        super().__init__()
        self.embeddings = embeddings
        self.layers = nn.ModuleList(layers)
        self.final_norm = final_norm
        self.pooler = pooler
        self.mlm_head = mlm_head

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        token_type_ids: torch.Tensor | None = None,
    ) -> EncoderOutput:
        length = input_ids.shape[1]
        position_ids = padded_positions(input_ids, attention_mask)
        mask = build_mask(attention_mask, length, length, causal=False)
        x = self.embeddings(input_ids, position_ids, token_type_ids)
        rotary = self.embeddings.position.rotary(position_ids)
        for layer in self.layers:
            x, _ = layer(x, mask, rotary=rotary)
        if self.final_norm is not None:
            x = self.final_norm(x)
        pooled = self.pooler(x) if self.pooler is not None else None
        logits = (self.mlm_head(x, self.embeddings.token.weight)
                  if self.mlm_head is not None else None)
        return EncoderOutput(x, pooled, logits)
