"""The router's auxiliary (load-balancing) loss of a mixture of experts, and the experts' load,
for `zoo train` on a card with `activation: moe` (zoo/blocks/experts.py).

The loss is the Switch Transformer's (Fedus et al. 2021, eqs. 4-6), as Mixtral, Qwen3-MoE and
OLMoE train with it (transformers' `load_balancing_loss_func`): over every sparse layer's
tokens, n_experts * sum_e f_e * P_e, with f_e the share of top-k choices that went to expert e
(each token counted k times, so the shares sum to k) and P_e the mean router probability of e.
Its least, k, is a perfectly even load; it is added to the loss times `router_aux_loss_coef`.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from zoo.blocks.experts import moe_blocks


@dataclass
class Routed:
    loss: torch.Tensor  # the auxiliary loss, before its coefficient
    load: list[list[float]]  # per sparse layer, each expert's share of the top-k choices


def load_balancing_loss(logits: tuple[torch.Tensor, ...], n_experts: int, k: int
                        ) -> torch.Tensor:
    """Each layer's router logits (tokens, n_experts), all layers' tokens pooled."""
    pooled = torch.cat(logits).float()
    probabilities = pooled.softmax(dim=-1)
    chosen = probabilities.topk(k, dim=-1).indices
    shares = nn.functional.one_hot(chosen, n_experts).float().sum(dim=1).mean(dim=0)
    return n_experts * (shares * probabilities.mean(dim=0)).sum()


def expert_load(logits: torch.Tensor, k: int) -> list[float]:
    """Each expert's share of one layer's top-k choices (they sum to 1)."""
    chosen = logits.detach().topk(k, dim=-1).indices.flatten()
    counts = torch.bincount(chosen, minlength=logits.shape[-1]).float()
    return [round(share, 4) for share in (counts / counts.sum()).tolist()]


def routed(model: nn.Module, n_experts: int, k: int) -> Routed | None:
    """The last training forward's routing (None for a model without experts)."""
    logits = []
    for block in moe_blocks(model):
        if block.router_logits is not None:
            logits.append(block.router_logits)
            block.router_logits = None  # taken: the module keeps no graph alive
    logits = tuple(logits)
    if not logits:
        return None
    return Routed(load_balancing_loss(logits, n_experts, k),
                  [expert_load(layer, k) for layer in logits])
