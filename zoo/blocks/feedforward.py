"""Position-wise feed-forward blocks. Every one is built as `FFN(d_model, d_ff, dropout, bias)`."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn


class FeedForward(nn.Module):
    """Linear -> activation -> dropout -> linear, the paper's FFN(x) = max(0, xW1 + b1)W2 + b2."""

    activation: staticmethod

    def __init__(self, d_model: int, d_ff: int, dropout: float, bias: bool) -> None:
        super().__init__()
        self.up = nn.Linear(d_model, d_ff, bias=bias)
        self.down = nn.Linear(d_ff, d_model, bias=bias)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(self.dropout(self.activation(self.up(x))))


class ReluFeedForward(FeedForward):
    activation = staticmethod(F.relu)


def gelu_erf(x: torch.Tensor) -> torch.Tensor:
    """Exact (erf) GELU, written out in the one order ONNX Runtime's GeluFusion matches when it
    loads a graph (x * 0.5, times 1 + erf(x / sqrt 2)): the session then runs it, with the
    linear layer's bias, as one BiasGelu kernel. F.gelu exports as 0.5 * (1 + erf) first, which
    no fusion matches, and stays five elementwise kernels."""
    return x * 0.5 * (1.0 + torch.erf(x / math.sqrt(2.0)))


class GeluFeedForward(FeedForward):
    """Exact (erf) GELU, as BERT."""

    activation = staticmethod(gelu_erf)


class GeluTanhFeedForward(FeedForward):
    """GELU's tanh approximation, as GPT-2."""

    activation = staticmethod(lambda x: F.gelu(x, approximate="tanh"))


class SiluFeedForward(FeedForward):
    """SiLU, "swish": x * sigmoid(x), as MarianMT."""

    activation = staticmethod(F.silu)


class SwiGLUFeedForward(nn.Module):
    """SwiGLU (Shazeer 2020): down(silu(gate(x)) * up(x))."""

    def __init__(self, d_model: int, d_ff: int, dropout: float, bias: bool) -> None:
        super().__init__()
        self.gate = nn.Linear(d_model, d_ff, bias=bias)
        self.up = nn.Linear(d_model, d_ff, bias=bias)
        self.down = nn.Linear(d_ff, d_model, bias=bias)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(self.dropout(F.silu(self.gate(x)) * self.up(x)))


FEED_FORWARDS: dict[str, type[nn.Module]] = {
    "relu": ReluFeedForward,
    "gelu": GeluFeedForward,
    "gelu_tanh": GeluTanhFeedForward,
    "silu": SiluFeedForward,
    "swiglu": SwiGLUFeedForward,
}
