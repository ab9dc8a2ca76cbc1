"""A dual encoder's card (registry/dual.py): its image tower validated as a card of its own,
and what a dual encoder needs or cannot have refused in one line naming the file and field."""

from __future__ import annotations

from typing import Any

import pytest

from registry.errors import CardError
from registry.schema import validate
from tests.conftest import CATALOG


def fields(**changes: Any) -> dict[str, Any]:
    card = dict(CATALOG.get("clip-tiny").fields)
    vision = changes.pop("vision_changes", {})
    return {**card, "vision": {**card["vision"], **vision}, **changes}


@pytest.mark.parametrize(("changes", "expected"), [
    ({"vision": None}, "clip.yaml: family dual-encoder needs vision"),
    ({"vision_changes": {"stem": "token_embedding"}},
     "clip.yaml (vision): image_size applies only to stem patch_embedding"),
    ({"vision_changes": {"image_size": 30}},
     "clip.yaml (vision): image_size=30 is not a multiple of patch_size=8"),
    ({"vision_changes": {"class_token": False}},
     "vision_pooling=cls needs the vision tower's class_token"),
    ({"projection_dim": None}, "needs projection_dim"),
    ({"vision_projection": False}, "vision_projection=false needs the vision tower's d_model=48"),
    ({"pooling": "cls"}, "pooling='cls' for family dual-encoder should be one of eos, last"),
    ({"eos_token_id": None}, "pooling=eos needs eos_token_id"),
    ({"pooler": True}, "pooler=True applies only to family encoder"),
])
def test_a_dual_card_is_refused_by_field(changes: dict[str, Any], expected: str) -> None:
    with pytest.raises(CardError) as refused:
        validate(fields(**changes), "clip.yaml")
    assert expected in str(refused.value)
    assert "\n" not in str(refused.value)


def test_a_dual_field_on_another_family_is_refused() -> None:
    card = {**CATALOG.get("bert-tiny").fields, "projection_dim": 8}
    with pytest.raises(CardError, match="bert.yaml: projection_dim applies only to family "
                                        "dual-encoder, not encoder"):
        validate(card, "bert.yaml")


def test_the_shipped_cards_validate_again_resolved() -> None:
    """A resolved card (config.yaml's) validates to itself, its vision tower too."""
    for name in ("clip-tiny", "siglip-tiny"):
        card = CATALOG.get(name).fields
        assert validate(dict(card), f"{name}.yaml") == card
