"""Shared fixtures: the shipped cards, by name, and small helpers for random inputs."""

from __future__ import annotations

import pytest
import torch

from registry import Card, open_catalog

CATALOG = open_catalog()
ALL_CARDS = CATALOG.names()
TINY_CARDS = CATALOG.names("*-tiny")
FULL_CARDS = [name for name in ALL_CARDS if name not in TINY_CARDS]


def card(name: str, **overrides: object) -> Card:
    return CATALOG.get(name, overrides or None)


def random_ids(card: Card, batch: int, length: int, seed: int = 0) -> torch.Tensor:
    """Ids that avoid the special tokens below 3 and the pad token."""
    generator = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, card["vocab_size"], (batch, length), generator=generator)
    return ids.masked_fill(ids == card["pad_token_id"], 3)


@pytest.fixture(params=TINY_CARDS)
def tiny_card(request: pytest.FixtureRequest) -> Card:
    return card(request.param)


def count_module_parameters(model: torch.nn.Module) -> int:
    return sum(parameter.numel() for parameter in model.parameters())
