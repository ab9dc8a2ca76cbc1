"""Blocks and families, run over every shipped card: counts, shapes, masks, cache, norms."""

from __future__ import annotations

import math

import pytest
import torch

from registry import count_parameters
from tests.conftest import ALL_CARDS, TINY_CARDS, card, count_module_parameters, random_ids
from zoo.assemble import build_model
from zoo.blocks.positions import sinusoid_table


def forward(model: torch.nn.Module, family: str, ids: torch.Tensor,
            mask: torch.Tensor | None = None) -> torch.Tensor:
    """The main output of any family: logits, or the encoder's hidden states."""
    if family == "decoder":
        return model(ids, mask)[0]
    if family == "encoder":
        return model(ids, mask)["last_hidden_state"]
    return model(ids, ids, mask)


@pytest.mark.parametrize("name", ALL_CARDS)
def test_arithmetic_count_equals_module_count(name: str) -> None:
    model = build_model(card(name), meta=True)  # no memory, even for transformer-big
    assert count_module_parameters(model) == sum(count_parameters(card(name).fields).values())


def test_published_parameter_counts() -> None:
    assert sum(count_parameters(card("gpt2-small").fields).values()) == 124_439_808
    bert = build_model(card("bert-base", mlm_head=False), meta=True)
    assert count_module_parameters(bert) == 109_482_240


def test_sinusoidal_positions_follow_the_paper() -> None:
    d_model, positions = 16, 50
    table = sinusoid_table(positions, d_model)
    for pos in (0, 1, 7, 49):
        for i in range(d_model // 2):
            angle = pos / 10000 ** (2 * i / d_model)
            assert table[pos, 2 * i].item() == pytest.approx(math.sin(angle), abs=1e-6)
            assert table[pos, 2 * i + 1].item() == pytest.approx(math.cos(angle), abs=1e-6)


@pytest.mark.parametrize("name", TINY_CARDS)
def test_forward_shapes_no_nan_and_backward_reaches_every_parameter(name: str) -> None:
    tiny = card(name)
    model = build_model(tiny).train()
    ids = random_ids(tiny, 2, 7)
    if tiny.family == "encoder":
        out = model(ids, torch.ones_like(ids), torch.zeros_like(ids))
        assert out["last_hidden_state"].shape == (2, 7, tiny["d_model"])
        assert not tiny["pooler"] or out["pooler_output"].shape == (2, tiny["d_model"])
        assert out["logits"].shape == (2, 7, tiny["vocab_size"])
        loss = sum(t.sum() for t in out.values())
    else:
        logits = forward(model, tiny.family, ids)
        assert logits.shape == (2, 7, tiny["vocab_size"])
        loss = logits.sum()
    assert torch.isfinite(loss)
    loss.backward()
    unreached = [n for n, p in model.named_parameters() if p.grad is None or not p.grad.any()]
    assert not unreached


@pytest.mark.parametrize("name", [n for n in TINY_CARDS if card(n).family != "encoder"])
def test_a_later_token_never_changes_earlier_outputs(name: str) -> None:
    tiny = card(name)
    model = build_model(tiny)
    ids = random_ids(tiny, 2, 9)
    changed = ids.clone()
    changed[:, 6:] = (changed[:, 6:] + 1) % tiny["vocab_size"]
    with torch.no_grad():
        before, after = forward(model, tiny.family, ids), forward(model, tiny.family, changed)
    if tiny.family == "encoder-decoder":  # the target side is causal; vary only the target
        with torch.no_grad():
            memory = model.cross_cache(model.encode(ids))
            before = model.decode(ids, memory)[0]
            after = model.decode(changed, memory)[0]
    torch.testing.assert_close(before[:, :6], after[:, :6], atol=1e-6, rtol=0)
    assert not torch.allclose(before[:, 6:], after[:, 6:])


@pytest.mark.parametrize("name", [n for n in TINY_CARDS if card(n).family == "encoder"])
def test_extra_padding_leaves_unpadded_outputs_unchanged(name: str) -> None:
    tiny = card(name)
    model = build_model(tiny)
    ids = random_ids(tiny, 2, 6)
    padded = torch.cat([ids, torch.full((2, 5), tiny["pad_token_id"])], dim=1)
    mask = torch.cat([torch.ones(2, 6), torch.zeros(2, 5)], dim=1).long()
    with torch.no_grad():
        plain = model(ids)
        extra = model(padded, mask)
        left = model(padded.roll(5, dims=1), mask.roll(5, dims=1))
    torch.testing.assert_close(extra["last_hidden_state"][:, :6], plain["last_hidden_state"],
                               atol=1e-5, rtol=0)
    if tiny["pooler"]:  # BERT's; ModernBERT has none
        torch.testing.assert_close(extra["pooler_output"], plain["pooler_output"], atol=1e-5,
                                   rtol=0)
    torch.testing.assert_close(left["last_hidden_state"][:, 5:], plain["last_hidden_state"],
                               atol=1e-5, rtol=0)


@pytest.mark.parametrize("side", ["right", "left"])
def test_source_padding_leaves_encoder_decoder_outputs_unchanged(side: str) -> None:
    tiny = card("transformer-tiny")
    model = build_model(tiny)
    source, target = random_ids(tiny, 2, 6), random_ids(tiny, 2, 4, seed=1)
    pads, ones = torch.zeros(2, 3, dtype=torch.long), torch.ones(2, 6, dtype=torch.long)
    parts = [(source, ones), (pads, pads)] if side == "right" else [(pads, pads), (source, ones)]
    padded = torch.cat([p[0] for p in parts], dim=1)
    mask = torch.cat([p[1] for p in parts], dim=1)
    with torch.no_grad():
        plain = model.decode(target, model.cross_cache(model.encode(source)))[0]
        extra = model.decode(target, model.cross_cache(model.encode(padded, mask)), mask)[0]
    torch.testing.assert_close(extra, plain, atol=1e-5, rtol=0)


@pytest.mark.parametrize("overrides", [{}, {"position": "rotary"}, {"norm_placement": "post"},
                                       {"norm": "rmsnorm", "activation": "swiglu"},
                                       {"position": "rotary", "attention_pattern": "LG",
                                        "sliding_window": 3, "rope_theta_local": 500.0}])
def test_decoder_cache_steps_equal_one_full_forward(overrides: dict) -> None:
    tiny = card("gpt-tiny", **overrides)
    model = build_model(tiny)
    ids = random_ids(tiny, 2, 10)
    with torch.no_grad():
        full, _ = model(ids)
        steps, past = [], None
        for start, stop in ((0, 4), (4, 5), (5, 6), (6, 10)):
            logits, past = model(ids[:, start:stop], past_key_values=past)
            steps.append(logits)
    torch.testing.assert_close(torch.cat(steps, dim=1), full, atol=1e-5, rtol=0)
    assert past[0][0].shape == (2, tiny["n_heads"], 10, tiny["d_model"] // tiny["n_heads"])


@pytest.mark.parametrize("overrides", [{}, {"norm_placement": "pre", "final_norm": True}])
def test_encoder_decoder_cache_steps_equal_one_full_forward(overrides: dict) -> None:
    tiny = card("transformer-tiny", **overrides)
    model = build_model(tiny)
    source, target = random_ids(tiny, 2, 7), random_ids(tiny, 2, 8, seed=1)
    with torch.no_grad():
        memory = model.cross_cache(model.encode(source))
        full, _ = model.decode(target, memory)
        steps, past = [], None
        for position in range(8):
            logits, past = model.decode(target[:, position:position + 1], memory,
                                        past_key_values=past)
            steps.append(logits)
    torch.testing.assert_close(torch.cat(steps, dim=1), full, atol=1e-5, rtol=0)


def test_pre_and_post_norm_are_both_built_and_differ() -> None:
    ids = random_ids(card("gpt-tiny"), 1, 5)
    outputs = {}
    for placement in ("pre", "post"):
        tiny = card("gpt-tiny", norm_placement=placement)
        model = build_model(tiny, seed=0)
        x = torch.randn(1, 4, tiny["d_model"], generator=torch.Generator().manual_seed(0)) * 5
        with torch.no_grad():
            outputs[placement] = model(ids)[0]
            unit = [torch.allclose(layer(x, None)[0].var(-1, unbiased=False), torch.ones(1, 4),
                                   atol=1e-3) for layer in model.layers]
        # Post-norm: each layer ends in a LayerNorm (unit weight at init), so rows have unit
        # variance; pre-norm: it ends in the residual sum, which keeps the input's scale.
        assert unit == [placement == "post"] * tiny["n_layers"]
    # Same weights, different wiring: the outputs must differ.
    assert not torch.allclose(outputs["pre"], outputs["post"])


def test_post_norm_normalises_each_sublayer_output() -> None:
    model = build_model(card("bert-tiny"))
    layer = model.layers[0]
    x = torch.randn(1, 4, 64) * 5
    with torch.no_grad():
        out, _ = layer(x, None)
    # Post-norm: the layer ends in a LayerNorm with unit weight, so each row has unit variance.
    torch.testing.assert_close(out.var(-1, unbiased=False), torch.ones(1, 4), atol=1e-3, rtol=0)
