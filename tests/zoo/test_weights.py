"""safetensors round trips: exact, deterministic per seed, tied weights stored once."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from tests.conftest import TINY_CARDS, card, random_ids
from zoo.assemble import build_model
from zoo.files.weights import WEIGHTS, load_built, save_built


@pytest.mark.parametrize("name", TINY_CARDS)
def test_save_load_round_trip_is_exact(name: str, tmp_path: Path) -> None:
    tiny = card(name)
    model = build_model(tiny, seed=5)
    save_built(model, tiny, tmp_path / "built")
    loaded, loaded_card = load_built(tmp_path / "built")
    assert loaded_card.fields == tiny.fields
    for (key, a), (_, b) in zip(model.state_dict().items(), loaded.state_dict().items(),
                                strict=True):
        assert torch.equal(a, b), key
    ids = random_ids(tiny, 1, 5)
    with torch.no_grad():
        if tiny.family == "encoder-decoder":
            assert torch.equal(model(ids, ids), loaded(ids, ids))
        elif tiny.family == "encoder":
            assert torch.equal(model(ids)["last_hidden_state"], loaded(ids)["last_hidden_state"])
        else:
            assert torch.equal(model(ids)[0], loaded(ids)[0])


@pytest.mark.parametrize("name", TINY_CARDS)
def test_same_seed_same_bytes_other_seed_other_bytes(name: str, tmp_path: Path) -> None:
    for folder, seed in (("a", 1), ("b", 1), ("c", 2)):
        save_built(build_model(card(name), seed=seed), card(name), tmp_path / folder)
    a, b, c = ((tmp_path / f / WEIGHTS).read_bytes() for f in "abc")
    assert a == b
    assert a != c


def test_tied_embedding_is_stored_once(tmp_path: Path) -> None:
    save_built(build_model(card("gpt-tiny")), card("gpt-tiny"), tmp_path / "m")
    tensors = load_file(tmp_path / "m" / WEIGHTS)
    vocab_sized = [k for k, t in tensors.items() if t.shape[0] == card("gpt-tiny")["vocab_size"]]
    assert vocab_sized == ["embeddings.token.weight"]
