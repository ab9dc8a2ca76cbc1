"""The family table: the one place a family name becomes the object that knows what the family
means to export, check, run and benchmark (export/family.py)."""

from __future__ import annotations

from typing import Any

from export.families.decoder import DecoderFamily
from export.families.dual import DualEncoderFamily
from export.families.encoder import EncoderFamily
from export.families.seq2seq import Seq2SeqFamily
from export.family import Family
from registry.errors import ZooError
from registry.families import register_spec

FAMILIES: dict[str, Family] = {
    family.name: family for family in (DecoderFamily(), EncoderFamily(), Seq2SeqFamily(),
                                       DualEncoderFamily())
}


def family_of(card: Any) -> Family:
    """The family object for a card (or anything with `.family` and the card's fields)."""
    return FAMILIES[card.family].variant(card)


def register_family(family: Family) -> None:
    """Add a family (a plugin's, or a test's); one name twice is an error."""
    if family.name in FAMILIES:
        raise ZooError(f"family '{family.name}' is already registered")
    register_spec(family.spec)
    FAMILIES[family.name] = family
