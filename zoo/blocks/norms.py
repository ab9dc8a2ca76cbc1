"""Norms. Every norm is built as `Norm(d_model, eps)`."""

from __future__ import annotations

import torch
from torch import nn


class LayerNorm(nn.LayerNorm):
    """torch's LayerNorm, so real checkpoints load without numerical drift."""

    def __init__(self, d_model: int, eps: float) -> None:
        super().__init__(d_model, eps=eps)


class RMSNorm(nn.Module):
    """Root-mean-square norm (Zhang & Sennrich 2019): scale only, no centring, no bias."""

    def __init__(self, d_model: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(d_model))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # A division, not x * rsqrt(...): ONNX Runtime fuses Pow-ReduceMean-Add-Sqrt-Div-Mul
        # into one SimplifiedLayerNormalization when it loads a graph, but not the Reciprocal
        # form torch emits for rsqrt (seven nodes a norm instead of one, measured on 1.31).
        return x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


NORMS: dict[str, type[nn.Module]] = {"layernorm": LayerNorm, "rmsnorm": RMSNorm}
