"""Output heads: the LM head (tied to the token embedding or not), the MLM head, the pooler."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class LMHead(nn.Module):
    """Hidden states to vocabulary logits. Tied, it uses the embedding matrix it is handed at
    call time instead of holding a second reference, so the weight is stored once."""

    def __init__(self, d_model: int, vocab_size: int, tied: bool, bias: bool = False) -> None:
        super().__init__()
        self.weight = None if tied else nn.Parameter(torch.empty(vocab_size, d_model))
        self.bias = nn.Parameter(torch.zeros(vocab_size)) if bias else None

    def forward(self, x: torch.Tensor, embedding_weight: torch.Tensor) -> torch.Tensor:
        weight = embedding_weight if self.weight is None else self.weight
        return F.linear(x, weight, self.bias)


class MLMHead(nn.Module):
    """BERT's masked-LM head: dense, GELU, norm, then vocabulary logits with their own bias."""

    def __init__(self, d_model: int, vocab_size: int, norm: nn.Module, tied: bool) -> None:
        super().__init__()
        self.transform = nn.Linear(d_model, d_model)
        self.norm = norm
        self.output = LMHead(d_model, vocab_size, tied, bias=True)

    def forward(self, x: torch.Tensor, embedding_weight: torch.Tensor) -> torch.Tensor:
        return self.output(self.norm(F.gelu(self.transform(x))), embedding_weight)


class Pooler(nn.Module):
    """tanh(W h_0 + b): the first token's state as a sentence vector (BERT)."""

    def __init__(self, d_model: int) -> None:
        super().__init__()
        self.dense = nn.Linear(d_model, d_model)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.tanh(self.dense(x[:, 0]))
