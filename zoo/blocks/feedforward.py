"""Position-wise feed-forward blocks: `FFN(d_model, d_ff, dropout, bias)`, and from a card
`FFN.from_card(card, layer)`."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from registry.blocks import effective_bias


class CardFeedForward:
    """What every feed-forward reads of a card, and how it is built from it."""

    reads = ("d_model", "d_ff", "dropout", "bias", "mlp_bias")

    @classmethod
    def from_card(cls, card: Mapping[str, Any], layer: int | None) -> nn.Module:
        return cls(card["d_model"], card["d_ff"], card["dropout"],
                   effective_bias(card, "mlp_bias"))


class FeedForward(CardFeedForward, nn.Module):
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


def gelu_tanh(x: torch.Tensor) -> torch.Tensor:
    """GELU's tanh approximation (F.gelu(x, approximate="tanh")), written out in the order
    ONNX Runtime's FastGeluFusion matches (x * 0.5 first, x ** 3 as Pow): a plain session
    then runs one FastGelu kernel instead of eight elementwise ones. F.gelu exports the 0.5
    on the (1 + tanh) side, which the fusion does not match."""
    inner = math.sqrt(2.0 / math.pi) * (x + 0.044715 * torch.pow(x, 3))
    return x * 0.5 * (1.0 + torch.tanh(inner))


class GeluFeedForward(FeedForward):
    """Exact (erf) GELU, as BERT."""

    activation = staticmethod(gelu_erf)


class GeluTanhFeedForward(FeedForward):
    """GELU's tanh approximation, as GPT-2."""

    activation = staticmethod(gelu_tanh)


def quick_gelu(x: torch.Tensor) -> torch.Tensor:
    """CLIP's sigmoid approximation of GELU: x * sigmoid(1.702 x) (transformers' quick_gelu)."""
    return x * torch.sigmoid(1.702 * x)


class QuickGeluFeedForward(FeedForward):
    """quick_gelu, as OpenAI's CLIP."""

    activation = staticmethod(quick_gelu)


class SiluFeedForward(FeedForward):
    """SiLU, "swish": x * sigmoid(x), as MarianMT."""

    activation = staticmethod(F.silu)


class GatedFeedForward(CardFeedForward, nn.Module):
    """A gated linear unit (Shazeer 2020): down(activation(gate(x)) * up(x))."""

    gate_activation: staticmethod

    def __init__(self, d_model: int, d_ff: int, dropout: float, bias: bool) -> None:
        super().__init__()
        self.gate = nn.Linear(d_model, d_ff, bias=bias)
        self.up = nn.Linear(d_model, d_ff, bias=bias)
        self.down = nn.Linear(d_ff, d_model, bias=bias)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(self.dropout(self.gate_activation(self.gate(x)) * self.up(x)))


class SwiGLUFeedForward(GatedFeedForward):
    """SwiGLU: the gate through SiLU, as Llama."""

    gate_activation = staticmethod(F.silu)


class GeGLUFeedForward(GatedFeedForward):
    """GeGLU: the gate through exact (erf) GELU, as ModernBERT."""

    gate_activation = staticmethod(gelu_erf)


class GeGLUTanhFeedForward(GatedFeedForward):
    """GeGLU with GELU's tanh approximation, as Gemma and T5 v1.1 (gelu_pytorch_tanh,
    gelu_new)."""

    gate_activation = staticmethod(gelu_tanh)
