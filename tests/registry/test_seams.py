"""The seams the redesign (issue #9) opened, each proved by plugging something in:

- a toy encoder head output, in one class plus one registration, exported and passing parity,
  its ONNX output checked against numpy;
- a toy attention core (torch's own scaled_dot_product_attention) swapped in through the public
  `Attention.core`, giving what the default core gives.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from export.families import family_of
from export.opening import open_export
from export.pipeline import export_and_verify
from runtime.encode import encoder_feeds
from tests.conftest import card, random_ids
from zoo.assemble import build_model
from zoo.blocks.attention import DOT_PRODUCT, Attention, attention_core
from zoo.blocks.heads import HeadInputs, HeadSpec, register_head, unregister_head


class MeanPooler(nn.Module):
    """Sentence embedding: the mean of the real tokens' final hidden states."""

    graph_output = "sentence_embedding"

    def forward(self, x: torch.Tensor, inputs: HeadInputs) -> torch.Tensor:
        if inputs.attention_mask is None:
            return x.mean(dim=1)
        weights = inputs.attention_mask.to(x.dtype)[..., None]  # (B, T, 1)
        return (x * weights).sum(dim=1) / weights.sum(dim=1).clamp(min=1.0)


@pytest.fixture
def mean_pooler() -> Iterator[None]:
    register_head(HeadSpec("mean_pooler", MeanPooler, lambda card: True,
                           lambda card, parts: MeanPooler()))
    try:
        yield
    finally:
        unregister_head("mean_pooler")


def test_a_registered_head_output_exports_and_passes_parity(mean_pooler: None,
                                                            tmp_path: Path) -> None:
    tiny = card("bert-tiny")
    outputs = family_of(tiny).contract(tiny)["onnx/model.onnx"][1]
    assert outputs == ["last_hidden_state", "pooler_output", "logits", "sentence_embedding"]
    model = build_model(tiny, seed=0)
    report = export_and_verify(model, tiny, tmp_path / "out")
    assert "sentence_embedding" in {row.output for row in report.rows}

    runtime = open_export(tmp_path / "out")
    assert runtime.manifest["graphs"]["onnx/model.onnx"]["outputs"] == outputs
    ids = random_ids(tiny, 3, 9).numpy()
    mask = np.ones_like(ids)
    mask[1, 6:] = 0
    mask[2, 3:] = 0
    result = runtime.run("onnx/model.onnx", encoder_feeds(tiny, ids, mask))
    hidden = result["last_hidden_state"].astype(np.float64)
    expected = np.stack([hidden[row, mask[row] == 1].mean(axis=0) for row in range(3)])
    np.testing.assert_allclose(result["sentence_embedding"], expected, atol=1e-5)


def test_two_heads_under_one_name_are_refused(mean_pooler: None) -> None:
    with pytest.raises(Exception, match="already registered"):
        register_head(HeadSpec("mean_pooler", MeanPooler, lambda card: True,
                               lambda card, parts: MeanPooler()))


class TorchScaledDotProduct:
    """The reference core: torch's fused attention on the module's own projections."""

    def __call__(self, attention: Attention, x: torch.Tensor, source: torch.Tensor | None,
                 mask: torch.Tensor | None, past, rotary):  # noqa: ANN001
        a = attention
        query = a.split_heads(a.query(x))
        if source is None:  # cross-attention: keys and values projected once, handed in
            key, value = past
        else:
            key, value = a.split_heads(a.key(source)), a.split_heads(a.value(source))
            if past is not None:
                key, value = torch.cat([past[0], key], dim=2), torch.cat([past[1], value], dim=2)
        merged = F.scaled_dot_product_attention(query, key, value, attn_mask=mask)
        batch, _, length, _ = query.shape
        return merged.transpose(1, 2).reshape(batch, length, -1), (key, value)


@pytest.mark.parametrize("name", ["gpt-tiny", "bert-tiny", "transformer-tiny"])
def test_a_swapped_core_computes_what_the_default_core_computes(name: str) -> None:
    tiny = card(name)
    if tiny["position"] == "rotary":
        pytest.skip("the reference core applies no rotary tables")
    model = build_model(tiny, seed=0)
    attentions = [m for m in model.modules() if isinstance(m, Attention)]
    ids = random_ids(tiny, 2, 7)
    run = {"decoder": lambda: model(ids)[0], "encoder": lambda: model(ids)["last_hidden_state"],
           "encoder-decoder": lambda: model(ids, ids)}[tiny.family]
    with torch.no_grad():
        default = run()
        with attention_core(attentions, TorchScaledDotProduct()):
            swapped = run()
        assert all(attention.core is DOT_PRODUCT for attention in attentions)  # restored
    torch.testing.assert_close(swapped, default, atol=1e-5, rtol=1e-5)
