"""Token embeddings, with optional sqrt(d_model) scaling, positions and token types."""

from __future__ import annotations

import math

import torch
from torch import nn


class Embeddings(nn.Module):
    def __init__(
        self,
        vocab_size: int,
        d_model: int,
        position: nn.Module,
        dropout: float,
        scale: bool = False,
        type_vocab_size: int = 0,
        norm: nn.Module | None = None,
    ) -> None:
        super().__init__()
        self.token = nn.Embedding(vocab_size, d_model)
        self.position = position
        self.token_type = nn.Embedding(type_vocab_size, d_model) if type_vocab_size else None
        self.norm = norm
        self.dropout = nn.Dropout(dropout)
        self.scale = math.sqrt(d_model) if scale else 1.0

    def forward(
        self,
        input_ids: torch.Tensor,
        position_ids: torch.Tensor,
        token_type_ids: torch.Tensor | None = None,
    ) -> torch.Tensor:
        x = self.token(input_ids) * self.scale
        x = self.position.add(x, position_ids)
        if self.token_type is not None:
            if token_type_ids is None:
                token_type_ids = torch.zeros_like(input_ids)
            x = x + self.token_type(token_type_ids)
        if self.norm is not None:
            x = self.norm(x)
        return self.dropout(x)
