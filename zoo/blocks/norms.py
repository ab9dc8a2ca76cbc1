"""Norms: `Norm(size, eps)`, and from a card `Norm.from_card(card, layer, size=None)` (the
hidden size unless told: the per-head query/key norms take the head size)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from torch import nn


class CardNorm:
    """What every norm reads of a card, and how it is built from it."""

    reads = ("d_model", "norm_eps")

    @classmethod
    def from_card(cls, card: Mapping[str, Any], layer: int | None, size: int | None = None
                  ) -> nn.Module:
        return cls(size or card["d_model"], card["norm_eps"])


class LayerNorm(CardNorm, nn.LayerNorm):
    """torch's LayerNorm, so real checkpoints load without numerical drift; without a bias
    where the card says (`norm_bias: false`, ModernBERT's)."""

    reads = (*CardNorm.reads, "norm_bias")

    def __init__(self, d_model: int, eps: float, bias: bool = True) -> None:
        super().__init__(d_model, eps=eps, bias=bias)

    @classmethod
    def from_card(cls, card: Mapping[str, Any], layer: int | None, size: int | None = None
                  ) -> nn.Module:
        return cls(size or card["d_model"], card["norm_eps"], card["norm_bias"])


class RMSNorm(CardNorm, nn.Module):
    """Root-mean-square norm (Zhang & Sennrich 2019): scale only, no centring, no bias."""

    def __init__(self, d_model: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(d_model))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # A division, not x * rsqrt(...): ONNX Runtime fuses Pow-ReduceMean-Add-Sqrt-Div-Mul
        # into one SimplifiedLayerNormalization when it loads a graph, but not the Reciprocal
        # form torch emits for rsqrt (seven nodes a norm instead of one, measured on 1.31).
        # In float32 whatever the model's dtype, as transformers' LlamaRMSNorm (x^2 overflows
        # float16 past 256); the weight multiplies in the model's dtype. A float32 model's
        # graph has no casts: .float() and .type_as() of a float32 tensor are the tensor.
        wide = x.float()
        return (wide / torch.sqrt(wide.pow(2).mean(-1, keepdim=True) + self.eps)
                ).type_as(x) * self.weight


class ProjectionNorm(nn.Module):
    """A norm over the whole query or key projection (OLMoE's q_norm and k_norm, the card's
    `qk_norm_scope: projection`), taking and giving the heads split (B, heads, T, hd) as a
    per-head norm does, so the attention cores call it alike. The norm's parameters are this
    module's own (`query_norm.weight`, as a per-head norm's), not a submodule's."""

    def __init__(self, norm: nn.Module) -> None:
        super().__init__()
        self.__dict__["norm"] = norm  # not registered: its parameters are adopted below
        for name, parameter in norm.named_parameters(recurse=False):
            self.register_parameter(name, parameter)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, heads, length, size = x.shape
        merged = x.transpose(1, 2).reshape(batch, length, heads * size)
        return self.norm(merged).reshape(batch, length, heads, size).transpose(1, 2)
class GemmaRMSNorm(RMSNorm):
    """Gemma's RMSNorm: the weight is an offset from one, x / rms(x) * (1 + w), and it is
    computed in float32 whatever the model's dtype (as transformers' Gemma3RMSNorm); its weight
    starts at zero, so the norm starts as the plain one."""

    def __init__(self, d_model: int, eps: float) -> None:
        super().__init__(d_model, eps)
        nn.init.zeros_(self.weight)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        wide = x.float()
        normed = wide / torch.sqrt(wide.pow(2).mean(-1, keepdim=True) + self.eps)
        return (normed * (1.0 + self.weight.float())).type_as(x)
