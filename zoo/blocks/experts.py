"""The mixture-of-experts feed-forward (`activation: moe`; its fields: registry/experts.py).

`MixtureOfExperts.from_card(card, layer)` gives a sparse layer its router and SwiGLU experts,
and a dense one (registry/experts.py `is_sparse`) the card's SwiGLU of d_ff.

Every expert runs on every token and the outputs are summed with the router's weights, which
are zero outside each token's top k: exact (an unchosen expert adds 0 times a finite number),
one graph for PyTorch and ONNX with no data-dependent shapes, and each expert's weights plain
2-D matrices the int4/int8 quantizer reaches. It costs n_experts / k times the chosen experts'
products: right for the tiny cards the zoo trains and checks, not for serving a large one.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import torch
from torch import nn

from registry.blocks import effective_bias
from registry.experts import is_sparse
from zoo.blocks.feedforward import SwiGLUFeedForward


def route(logits: torch.Tensor, k: int, normalise: bool) -> torch.Tensor:
    """Each token's weight per expert (..., n_experts): the softmax's top k, renormalised to
    sum to 1 where `normalise`, zero elsewhere. In float32, as transformers' routers."""
    probabilities = logits.float().softmax(dim=-1)
    top, chosen = probabilities.topk(k, dim=-1)
    if normalise:
        top = top / top.sum(dim=-1, keepdim=True)
    return torch.zeros_like(probabilities).scatter(-1, chosen, top).to(logits.dtype)


class MixtureOfExperts(nn.Module):
    """A router (Linear d_model -> n_experts, no bias) over SwiGLU experts."""

    reads = ("d_model", "d_ff", "dropout", "bias", "mlp_bias", "n_experts",
             "n_experts_per_token", "moe_d_ff", "norm_topk_prob", "mlp_only_layers",
             "decoder_sparse_step")

    def __init__(self, d_model: int, d_ff: int, n_experts: int, k: int, normalise: bool,
                 dropout: float, bias: bool) -> None:
        super().__init__()
        self.router = nn.Linear(d_model, n_experts, bias=False)
        self.experts = nn.ModuleList(SwiGLUFeedForward(d_model, d_ff, dropout, bias)
                                     for _ in range(n_experts))
        self.k, self.normalise = k, normalise
        # The last training forward's router logits (tokens, n_experts), for the auxiliary
        # loss (zoo/training/experts.py); None in eval, so no graph is kept alive.
        self.router_logits: torch.Tensor | None = None
        # Another computation of the same mixture, for one export (export/onnx/experts.py:
        # ONNX Runtime's MoE operator); None: the dense sum below.
        self.operator: Callable[[MixtureOfExperts, torch.Tensor], torch.Tensor] | None = None

    @classmethod
    def from_card(cls, card: Mapping[str, Any], layer: int | None) -> nn.Module:
        if card.get("n_experts") is None or not is_sparse(card, layer):
            # a card without experts, or a layer that stays dense: the SwiGLU of d_ff
            return SwiGLUFeedForward.from_card(card, layer)
        return cls(card["d_model"], card["moe_d_ff"], card["n_experts"],
                   card["n_experts_per_token"], card["norm_topk_prob"], card["dropout"],
                   effective_bias(card, "mlp_bias"))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.operator is not None:
            return self.operator(self, x)
        logits = self.router(x)
        self.router_logits = logits.reshape(-1, logits.shape[-1]) if self.training else None
        weights = route(logits, self.k, self.normalise)  # (..., n_experts)
        outputs = torch.stack([expert(x) for expert in self.experts], dim=-1)  # (..., d, E)
        return (outputs * weights.unsqueeze(-2)).sum(dim=-1)


def moe_blocks(model: nn.Module) -> list[MixtureOfExperts]:
    return [module for module in model.modules() if isinstance(module, MixtureOfExperts)]

