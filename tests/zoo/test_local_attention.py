"""Local (sliding-window) layers beside global ones (zoo/blocks/windows.py): the masks against
transformers' own mask functions, the cache, the pattern, and the card's checks."""

from __future__ import annotations

import pytest
import torch
from transformers import masking_utils

from registry.errors import CardError
from tests.conftest import card, random_ids
from zoo.assemble import build_model
from zoo.blocks.attention import build_mask


def _reference(function, query_length: int, key_length: int) -> torch.Tensor:
    """transformers' mask function evaluated at every (query, key), queries the last ones."""
    offset, index = key_length - query_length, torch.tensor
    return torch.tensor([[bool(function(index(0), index(0), index(offset + q), index(k)))
                          for k in range(key_length)] for q in range(query_length)])


@pytest.mark.parametrize(("query_length", "key_length"), [(7, 7), (1, 9), (3, 8)])
@pytest.mark.parametrize("window", [1, 2, 3, 5])
def test_causal_window_is_transformers_sliding_window(window: int, query_length: int,
                                                      key_length: int) -> None:
    mask = build_mask(None, query_length, key_length, causal=True, window=window)
    expected = _reference(masking_utils.sliding_window_causal_mask_function(window),
                          query_length, key_length)
    assert torch.equal(mask[0, 0] == 0, expected)


@pytest.mark.parametrize("window", [2, 4, 5, 8])
def test_bidirectional_window_is_modernberts_half_window(window: int) -> None:
    """ModernBERT's local_attention=w is transformers' bidirectional window of w // 2."""
    mask = build_mask(None, 9, 9, causal=False, window=window)
    expected = _reference(masking_utils.sliding_window_bidirectional_mask_function(window // 2),
                          9, 9)
    assert torch.equal(mask[0, 0] == 0, expected)


def test_window_and_padding_combine() -> None:
    padding = torch.tensor([[0, 0, 1, 1, 1, 1]])
    mask = build_mask(padding, 6, 6, causal=True, window=2)[0, 0] == 0
    assert not mask[:, :2].any()
    assert mask[5].tolist() == [False, False, False, False, True, True]


LOCAL = {"position": "rotary", "norm": "rmsnorm", "attention_pattern": "LG",
         "sliding_window": 3}


def _logits(model: torch.nn.Module, ids: torch.Tensor, **kwargs) -> torch.Tensor:
    with torch.no_grad():
        return model(ids, **kwargs)[0]


def test_local_layers_follow_the_pattern_and_change_the_result() -> None:
    tiny = card("gpt-tiny", **LOCAL)
    model = build_model(tiny)
    assert [layer.local for layer in model.layers] == [True, False]
    ids = random_ids(tiny, 2, 10)
    global_model = build_model(card("gpt-tiny", position="rotary", norm="rmsnorm"))
    global_model.load_state_dict(model.state_dict())
    assert not torch.allclose(_logits(model, ids), _logits(global_model, ids), atol=1e-4)
    # a window as long as the sequence is global attention
    wide = build_model(card("gpt-tiny", **{**LOCAL, "sliding_window": 10}))
    wide.load_state_dict(model.state_dict())
    torch.testing.assert_close(_logits(wide, ids), _logits(global_model, ids), atol=1e-6,
                               rtol=0)


def test_local_rotary_base_is_used_only_by_local_layers() -> None:
    base = card("gpt-tiny", **LOCAL)
    model = build_model(base)
    ids = random_ids(base, 1, 8)
    same = build_model(card("gpt-tiny", **LOCAL, rope_theta_local=base["rope_theta"]))
    same.load_state_dict(model.state_dict())
    torch.testing.assert_close(_logits(same, ids), _logits(model, ids), atol=0, rtol=0)
    other = build_model(card("gpt-tiny", **LOCAL, rope_theta_local=50.0))
    other.load_state_dict(model.state_dict())
    assert not torch.allclose(_logits(other, ids), _logits(model, ids), atol=1e-4)


def test_encoder_local_layers_see_half_the_window_either_side() -> None:
    tiny = card("bert-tiny", attention_pattern="L", sliding_window=4)
    model = build_model(tiny)
    ids = random_ids(tiny, 1, 12)
    with torch.no_grad():
        states = model(ids)["last_hidden_state"]
        changed = ids.clone()
        changed[0, 11] = 5 if ids[0, 11] != 5 else 6  # a token 3 away from position 8
        moved = model(changed)["last_hidden_state"]
    layers = tiny["n_layers"]  # information travels window // 2 tokens a layer
    reach = 11 - layers * 2
    torch.testing.assert_close(moved[0, :reach], states[0, :reach], atol=0, rtol=0)
    assert not torch.allclose(moved[0, reach:], states[0, reach:])


@pytest.mark.parametrize(("overrides", "message"), [
    ({"attention_pattern": "LX"}, "attention_pattern='LX' should be letters G"),
    ({"attention_pattern": "LG"}, "needs sliding_window"),
    ({"sliding_window": 4}, "sliding_window applies only to local layers"),
    ({"attention_pattern": "L", "sliding_window": 4, "rope_theta_local": 10.0},
     "rope_theta_local applies only to position rotary"),
])
def test_card_checks(overrides: dict, message: str) -> None:
    with pytest.raises(CardError, match=message):
        card("gpt-tiny", **overrides)


def test_encoder_decoder_refuses_local_layers() -> None:
    with pytest.raises(CardError, match="applies only to families encoder and decoder"):
        card("transformer-tiny", attention_pattern="L", sliding_window=4)
