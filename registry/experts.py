"""The mixture-of-experts feed-forward (`activation: moe`) as data: its card fields, which
layers are sparse, its checks across fields and its parameter counts (total and active). No
torch: `zoo list` and `zoo show` answer from here; zoo/blocks/experts.py builds it.

A sparse layer has a router (a linear map to one logit per expert, no bias) and `n_experts`
SwiGLU experts of inner size `moe_d_ff`; each token goes to the `n_experts_per_token` experts
of highest softmax probability, weighted by those probabilities, renormalised to sum to one
where `norm_topk_prob` (Qwen3-MoE, Mixtral's softmax over the chosen logits is the same) and
as they are where not (OLMoE). A layer in `mlp_only_layers`, or off the `decoder_sparse_step`,
stays the dense SwiGLU of inner size `d_ff` (Qwen3-MoE's rule, in transformers' words:
sparse where `layer not in mlp_only_layers and (layer + 1) % decoder_sparse_step == 0`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from registry.blocks import BlockEntry, register_block, three_matrices
from registry.errors import CardError

NAME = "moe"
MAX_EXPERTS = 4096  # the largest published mixtures have a few hundred

# Card fields of the block's own, as keyword arguments of registry.schema.Field (which turns
# them into Fields): present in a resolved card only where the card selects `moe`.
FIELDS: dict[str, dict[str, Any]] = {
    "n_experts": dict(type=int, help="experts in each sparse layer", minimum=1,
                      maximum=MAX_EXPERTS),
    "n_experts_per_token": dict(type=int, help="experts each token is routed to (top-k)",
                                minimum=1, maximum=MAX_EXPERTS),
    "moe_d_ff": dict(type=int, help="an expert's inner size (d_ff is the dense layers')",
                     minimum=1, maximum=2**18),
    "norm_topk_prob": dict(type=bool, default=True,
                           help="renormalise the chosen experts' probabilities to sum to 1 "
                           "(Qwen3-MoE, Mixtral); false: as the softmax gave them (OLMoE)"),
    "mlp_only_layers": dict(type=list, default=[],
                            help="layer indices that stay dense (the SwiGLU of d_ff)"),
    "decoder_sparse_step": dict(type=int, default=1, minimum=1,
                                help="every this-many-th layer is sparse: (layer + 1) % step "
                                "== 0 (1: all but mlp_only_layers)"),
    "router_aux_loss_coef": dict(type=float, default=0.001, minimum=0.0,
                                 help="weight of the router's load-balancing loss in training "
                                 "(Switch Transformer's, as transformers')"),
}


def register(field: Callable[..., Any]) -> None:
    """Add the block to registry/blocks.py's table, its fields made by `field`
    (registry.schema.Field, which registry/schema.py passes: it imports this module)."""
    register_block("activation", BlockEntry(
        NAME, "zoo.blocks.experts:MixtureOfExperts",
        three_matrices,  # a dense layer's SwiGLU; the sparse layers': moe_feed_forward_params
        fields={name: field(**spec) for name, spec in FIELDS.items()}))


def is_sparse(card: Any, layer: int | None) -> bool:
    """Whether layer `layer` of a `moe` card has experts (else the dense SwiGLU)."""
    if layer is None:
        return False
    return (layer not in card["mlp_only_layers"]
            and (layer + 1) % card["decoder_sparse_step"] == 0)


def check_experts(card: dict[str, Any], where: str) -> None:
    """The checks across the block's fields (registry/schema.py calls it for `moe` cards, and
    checks the family: a decoder's block)."""
    if card["n_experts_per_token"] > card["n_experts"]:
        raise CardError(f"{where}: n_experts_per_token={card['n_experts_per_token']} should be "
                        f"<= n_experts={card['n_experts']}")
    layers = card["mlp_only_layers"]
    if not all(isinstance(i, int) and not isinstance(i, bool) and 0 <= i < card["n_layers"]
               for i in layers):
        raise CardError(f"{where}: mlp_only_layers={layers!r} should list layer indices "
                        f"0..{card['n_layers'] - 1}")


def expert_params(card: dict[str, Any], bias: bool) -> int:
    """One SwiGLU expert: gate, up and down."""
    d, f = card["d_model"], card["moe_d_ff"]
    return 3 * d * f + (2 * f + d if bias else 0)


def sparse_layers(card: dict[str, Any]) -> int:
    return sum(is_sparse(card, layer) for layer in range(card["n_layers"]))


def moe_feed_forward_params(card: dict[str, Any], dense: int, bias: bool) -> int:
    """Every layer's feed-forward: `dense` (the SwiGLU of d_ff) where dense, else the router
    and every expert."""
    sparse = sparse_layers(card)
    router = card["d_model"] * card["n_experts"]
    return ((card["n_layers"] - sparse) * dense
            + sparse * (router + card["n_experts"] * expert_params(card, bias)))


def inactive_params(card: dict[str, Any], bias: bool) -> int:
    """Parameters a token does not use: the experts it is not routed to, in every sparse
    layer (active = total - this, as the published "A3B" counts are)."""
    idle = card["n_experts"] - card["n_experts_per_token"]
    return sparse_layers(card) * idle * expert_params(card, bias)
