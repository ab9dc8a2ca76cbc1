"""ALiBi (Press et al. 2022): attention with linear biases instead of position embeddings.

Head h (1-based) of n adds -m_h * |i - j| to the score of query i on key j, with
m_h = 2^(-max_bias * h / n) for n a power of two. Otherwise the paper takes the n' = 2^floor(log2 n)
slopes of n' heads, then every other slope of 2n' heads (the odd ones) for the rest (BLOOM's
`build_alibi_tensor`, MPT's `alibi_bias_max` is max_bias).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import torch
from torch import nn


def alibi_slopes(heads: int, max_bias: float) -> list[float]:
    closest = 2 ** math.floor(math.log2(heads))
    slopes = [2.0 ** (-max_bias * h / closest) for h in range(1, closest + 1)]
    odd = [2.0 ** (-max_bias * h / (2 * closest)) for h in range(1, 2 * closest + 1, 2)]
    return slopes + odd[: heads - closest]


class Alibi(nn.Module):
    """A position block with the third hook, `attention_bias`; `add` and `rotary` do nothing."""

    reads = ("n_heads", "alibi_max_bias")

    @classmethod
    def from_card(cls, card: Mapping[str, Any], layer: int | None) -> Alibi:
        return cls(card["n_heads"], card["alibi_max_bias"])

    def __init__(self, heads: int, max_bias: float) -> None:
        super().__init__()
        # A buffer, not a weight: never saved, a constant in the ONNX graph.
        self.register_buffer("slopes", torch.tensor(alibi_slopes(heads, max_bias)),
                             persistent=False)

    def add(self, x: torch.Tensor, position_ids: torch.Tensor) -> torch.Tensor:
        return x

    def rotary(self, position_ids: torch.Tensor) -> None:
        return None

    def attention_bias(self, query_length: int, key_length: int) -> torch.Tensor:
        """(1, heads, T, S): the T queries are the last T of the S keys (the first S - T are
        the cache). Raw indices, not padded positions: a row's padding shifts its queries and
        keys alike, and the bias depends only on their distance."""
        keys = torch.arange(key_length, device=self.slopes.device)
        queries = torch.arange(query_length, device=self.slopes.device) + (key_length
                                                                           - query_length)
        distance = (queries[:, None] - keys[None, :]).abs().to(self.slopes.dtype)  # (T, S)
        return -(self.slopes[:, None, None] * distance)[None]
