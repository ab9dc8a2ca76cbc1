"""Blocks are built from the card and their layer index, and say which card fields they read:
every built-in block, on every shipped card, reads nothing it does not declare; a block gets its
layer's index; a block's own card field may not shadow another's."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

import pytest
import torch
from torch import nn

from registry.blocks import BLOCKS, BlockEntry, register_block
from registry.errors import ZooError
from registry.schema import FIELDS, Field, validate
from tests.conftest import ALL_CARDS, CATALOG
from zoo.assemble import build_model
from zoo.blocks.attention import Attention
from zoo.blocks.classes import block_class
from zoo.blocks.layer import Layer

# The built-in blocks' classes, found as zoo/blocks/classes.py finds them: by the import path of
# their one declaration (registry/blocks.py, registry/experts.py)
BUILTIN = {kind: {name: block_class(kind, name) for name, entry in entries.items()
                  if entry.origin == "built-in"} for kind, entries in BLOCKS.items()}


class Recording(Mapping[str, Any]):
    """A card that notes every field read from it."""

    def __init__(self, fields: Mapping[str, Any]) -> None:
        self.fields, self.read = fields, set()

    def __getitem__(self, name: str) -> Any:
        self.read.add(name)
        return self.fields[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self.fields)

    def __len__(self) -> int:
        return len(self.fields)


# Every block but the stems, whose classes apply to their own cards only (the token stem is
# built by zoo/assemble.py's Parts, the patch stem from the card: STEMS)
BUILT_IN = [cls for kind, table in BUILTIN.items() if kind != "stem"
            for cls in table.values()] + [Attention]
STEMS = [cls for cls in BUILTIN["stem"].values() if hasattr(cls, "from_card")]


@pytest.mark.parametrize("name", ALL_CARDS)
def test_blocks_read_only_the_fields_they_declare(name: str) -> None:
    fields = CATALOG.get(name).fields
    with torch.device("meta"):  # full-size cards: no memory
        for cls in BUILT_IN:
            card = Recording(fields)
            cls.from_card(card, 0)
            assert card.read <= set(cls.reads), (cls.__name__, card.read - set(cls.reads))
        stem = BUILTIN["stem"][fields["stem"]]
        if stem in STEMS:
            card = Recording(fields)
            stem.from_card(card, None)
            assert card.read <= set(stem.reads), card.read - set(stem.reads)
        card = Recording(fields)
        Layer.from_card(card, 0, cross=fields["family"] == "encoder-decoder")
        parts = [Layer, Attention, BUILTIN["activation"][fields["activation"]],
                 BUILTIN["norm"][fields["norm"]]]
        declared = {"activation", "norm"}.union(*(cls.reads for cls in parts))
        assert card.read <= declared, card.read - declared


def test_declared_fields_are_the_schemas() -> None:
    """The schema's, or the block's own (registry/blocks.py: the mixture of experts')."""
    assert STEMS, "the patch stem builds itself from the card"
    for cls in [*BUILT_IN, *STEMS, Layer]:
        own = {field for kind, table in BUILTIN.items() for name, entry in table.items()
               if entry is cls for field in BLOCKS[kind][name].fields}
        assert set(cls.reads) <= set(FIELDS) | own, (cls.__name__,
                                                     set(cls.reads) - set(FIELDS) - own)


class IndexedNorm(nn.LayerNorm):
    """A norm that notes the layer index it was built for."""

    built: list[int | None] = []

    @classmethod
    def from_card(cls, card: Mapping[str, Any], layer: int | None, size: int | None = None
                  ) -> IndexedNorm:
        cls.built.append(layer)
        return cls(size or card["d_model"], eps=card["norm_eps"])


def test_each_block_gets_its_layer_index() -> None:
    register_block("norm", BlockEntry("indexed", f"{__name__}:IndexedNorm"))
    try:
        IndexedNorm.built.clear()
        build_model({**CATALOG.get("gpt-tiny").fields, "norm": "indexed"})
        assert IndexedNorm.built == [0, 0, 1, 1, None]  # two per layer, then the final norm
    finally:
        del BLOCKS["norm"]["indexed"]


def test_block_fields_may_not_shadow_others() -> None:
    spec = Field(float, 1.0, minimum=0.0)
    register_block("position", BlockEntry("shadowing", "x:Y", fields={"d_model": spec}))
    try:
        fields = {**CATALOG.get("gpt-tiny").fields, "position": "shadowing"}
        with pytest.raises(ZooError, match="card field 'd_model' is already a field of the "
                                           "schema"):
            validate(fields, "t.yaml")
    finally:
        del BLOCKS["position"]["shadowing"]
    register_block("position", BlockEntry("first", "x:Y", fields={"slope": spec}))
    try:
        with pytest.raises(ZooError, match="card field 'slope' is already declared by position "
                                           "block 'first'"):
            register_block("norm", BlockEntry("second", "x:Y", fields={"slope": spec}))
        assert "second" not in BLOCKS["norm"]
    finally:
        del BLOCKS["position"]["first"]
