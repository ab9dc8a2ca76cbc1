"""The dual encoder's card (CLIP, Radford et al. 2021; SigLIP, Zhai et al. 2023): the card's
own fields are its text tower (a token stem and encoder layers, causal for CLIP), `vision` is
its image tower, a card of its own (family encoder with a patch stem, registry/stems.py),
validated like any card. Both towers' vectors are projected into one space of projection_dim
and compared by their cosine times exp(logit_scale) (plus logit_bias: SigLIP's sigmoid).

No torch: zoo/models/dual_encoder.py builds it; registry/params.py counts it here.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from registry.errors import CardError
from registry.stems import PATCH_EMBEDDING, is_patch_card

DUAL = "dual-encoder"
VISION_POOLINGS = ("cls", "map")  # the class token's state (CLIP), an attention probe (SigLIP)
# fields that only a dual encoder reads
FIELDS = ("vision", "projection_dim", "projection_bias", "vision_projection", "logit_scale",
          "logit_bias", "vision_pooling", "causal")
# the text tower's parts a dual encoder has no use for
TEXT_UNUSED = ("pooler", "mlm_head", "num_labels", "type_vocab_size", "normalize")


def vision_card(card: dict[str, Any]) -> dict[str, Any]:
    return card["vision"]


def image_tower(card: Any) -> Any:
    """The card (or a dual encoder's tower) that reads pixels; None for a text model."""
    if is_patch_card(card):
        return card
    try:
        return card["vision"]
    except KeyError:  # a card from before dual encoders
        return None


def takes_text_mask(card: Any) -> bool:
    """Whether the text tower reads an attention mask: CLIP's masks its padding; SigLIP's texts
    are padded to max_positions and attend to the padding, as in training, so its graphs take
    input_ids alone (as Optimum's and transformers.js's SigLIP)."""
    return card["pooling"] != "last"


def text_card(card: dict[str, Any]) -> dict[str, Any]:
    """The text tower as an encoder card (its count and blocks are an encoder's)."""
    return {**card, "family": "encoder", "vision": None, "pooling": None}


def check_dual(card: dict[str, Any], where: str,
               validate: Callable[[dict[str, Any], str], dict[str, Any]],
               defaults: dict[str, Any]) -> None:
    """A dual encoder's fields; `card["vision"]` is replaced by the validated tower. `validate`
    and the FIELDS' `defaults` are registry.schema's (which imports this module): another
    family's card may carry them only at their defaults."""
    if card["family"] != DUAL:
        used = [name for name in FIELDS if card[name] != defaults[name]]
        if used:
            raise CardError(f"{where}: {used[0]} applies only to family {DUAL}, not "
                            f"{card['family']}")
        return
    vision = card["vision"]
    if vision is None:
        raise CardError(f"{where}: family {DUAL} needs vision (the image tower's card)")
    card["vision"] = tower = validate(vision, f"{where} (vision)")
    if tower["family"] != "encoder" or tower["stem"] != PATCH_EMBEDDING:
        raise CardError(f"{where} (vision): family {tower['family']} with stem {tower['stem']} "
                        f"should be family encoder with stem {PATCH_EMBEDDING}")
    if card["projection_dim"] is None:
        raise CardError(f"{where}: family {DUAL} needs projection_dim (the joint space's size)")
    if not card["vision_projection"] and tower["d_model"] != card["projection_dim"]:
        raise CardError(f"{where}: vision_projection=false needs the vision tower's d_model="
                        f"{tower['d_model']} equal to projection_dim={card['projection_dim']}")
    if card["vision_pooling"] == "cls" and not tower["class_token"]:
        raise CardError(f"{where}: vision_pooling=cls needs the vision tower's class_token")
    if card["pooling"] is None:
        raise CardError(f"{where}: family {DUAL} needs pooling (the text vector: eos or last)")
    if card["pooling"] == "eos" and card["eos_token_id"] is None:
        raise CardError(f"{where}: pooling=eos needs eos_token_id")
    for name in TEXT_UNUSED:
        if card[name]:
            raise CardError(f"{where}: {name}={card[name]!r} does not apply to family {DUAL}")


def dual_params(card: dict[str, Any], count: Callable[[dict[str, Any]], dict[str, int]],
                norm: Callable[[dict[str, Any]], int]) -> dict[str, int]:
    """Parameters per part: each tower as its card counts (`count` is registry/params.py's
    count_parameters), the projections, the probe head, the logit scale and bias."""
    vision, dim = vision_card(card), card["projection_dim"]
    bias = dim if card["projection_bias"] else 0
    projections = card["d_model"] * dim + bias
    if card["vision_projection"]:
        projections += vision["d_model"] * dim + bias
    parts = {"text tower": sum(count(text_card(card)).values()),
             "vision tower": sum(count(vision).values()), "projections": projections}
    if card["vision_pooling"] == "map":  # a probe, attention (in and out), norm, feed-forward
        d, ff = vision["d_model"], vision["d_ff"]
        parts["probe head"] = d + (3 * d * d + 3 * d) + (d * d + d) + norm(vision) + (
            2 * d * ff + ff + d)
    parts["logit scale"] = 1 + (card["logit_bias"] is not None)
    return parts
