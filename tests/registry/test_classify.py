"""Sentence vectors and classifiers as card fields (issue #11): validation, `zoo show`, the
parameter arithmetic, and pooling computed against formulas written out here."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from registry.params import count_parameters
from tests.conftest import card, count_module_parameters, random_ids
from tests.support.helpers import assert_one_line_error, zoo
from zoo.assemble import build_model

ENCODER_CLASSIFIER = {"pooling": "cls", "num_labels": 3, "mlm_head": False}
DECODER_CLASSIFIER = {"pooling": "last", "num_labels": 3}


@pytest.mark.parametrize(("name", "sets", "expected"), [
    ("gpt-tiny", ["pooling=cls"], "pooling='cls' for family decoder should be one of mean, last"),
    ("gpt-tiny", ["pooling=pooler"], "should be one of mean, last"),
    ("transformer-tiny", ["pooling=mean"], "should be absent (null)"),
    ("bert-tiny", ["pooling=avg"], "pooling='avg' should be one of cls, mean, last, pooler"),
    ("bert-tiny", ["pooling=pooler", "pooler=false"], "pooling='pooler' needs pooler: true"),
    ("bert-tiny", ["normalize=true"], "normalize=true needs a pooling"),
    ("bert-tiny", ["num_labels=2", "mlm_head=false"], "num_labels=2 needs a pooling"),
    ("bert-tiny", ["num_labels=2", "pooling=cls"], "both output 'logits'"),
    ("gpt-tiny", ["pooling=last", "num_labels=2", "labels=[a]"],
     "labels has 1 names, but num_labels=2"),
    ("gpt-tiny", ["pooling=last", "num_labels=2", "labels=[a, a]"], "labels names a more"),
    ("gpt-tiny", ["pooling=last", "num_labels=2", "labels=[a, 3]"], "a list of non-empty names"),
    ("gpt-tiny", ["num_labels=-1"], "num_labels=-1 should be >= 0"),
])
def test_bad_sequence_fields_are_one_line(name: str, sets: list[str], expected: str) -> None:
    assert_one_line_error(zoo("show", name, *(f"--set={s}" for s in sets)), expected)


def test_show_lists_the_fields_and_counts_the_classifier() -> None:
    result = zoo("show", "gpt-tiny", "--set", "pooling=mean",
                 "--set", "num_labels=2", "--set", "labels=[neg, pos]")
    assert result.exit_code == 0, result.output
    lines = {line.split()[0]: line for line in result.output.splitlines() if line.strip()}
    assert "mean" in lines["pooling"] and "--set" in lines["pooling"]
    assert "[neg, pos]" in lines["labels"]
    assert "false" in lines["normalize"]
    # gpt-tiny ties its LM head, so dropping it frees nothing; the classifier adds 64*2 + 2
    plain = sum(count_parameters(card("gpt-tiny").fields).values())
    assert f"parameters: {plain + 64 * 2 + 2:,}" in result.output


@pytest.mark.parametrize(("name", "overrides"), [
    ("bert-tiny", ENCODER_CLASSIFIER),
    ("bert-tiny", {"pooling": "pooler", "num_labels": 5, "mlm_head": False, "pooler": True}),
    ("bert-tiny", {"pooling": "mean", "normalize": True}),
    ("gpt-tiny", DECODER_CLASSIFIER),
    ("gpt-tiny", {"pooling": "mean", "tie_embeddings": False}),  # no LM head: no output matrix
])
def test_arithmetic_counts_the_built_module(name: str, overrides: dict) -> None:
    resolved = card(name, **overrides)
    assert sum(count_parameters(resolved.fields).values()) == count_module_parameters(
        build_model(resolved))


def _alone(model: torch.nn.Module, ids: torch.Tensor) -> torch.Tensor:
    """The row's hidden states computed with no padding at all."""
    return model(ids[None], torch.ones(1, len(ids), dtype=torch.long))["last_hidden_state"][0]


def _reference(pooling: str, hidden: torch.Tensor) -> torch.Tensor:
    """The pooling formulas, written out: first token, last token, plain average."""
    return {"cls": hidden[0], "last": hidden[-1], "mean": hidden.sum(0) / len(hidden)}[pooling]


@pytest.mark.parametrize(("name", "pooling", "side"), [
    ("bert-tiny", "mean", "left"), ("bert-tiny", "mean", "right"),
    ("bert-tiny", "cls", "left"), ("bert-tiny", "last", "right"),
    ("gpt-tiny", "mean", "left"), ("gpt-tiny", "mean", "right"),
    ("gpt-tiny", "last", "left"), ("gpt-tiny", "last", "right"),
])
def test_pooling_ignores_padding(name: str, pooling: str, side: str) -> None:
    """A padded batch gives each row the vector of its unpadded self (formula above)."""
    resolved = card(name, pooling=pooling, normalize=True)
    model = build_model(resolved)
    lengths = [7, 4, 1]
    rows = [random_ids(resolved, 1, n, seed=n)[0] for n in lengths]
    pad = resolved["pad_token_id"]
    ids = torch.full((3, 7), pad)
    mask = torch.zeros(3, 7, dtype=torch.long)
    for r, row in enumerate(rows):
        span = slice(7 - len(row), 7) if side == "left" else slice(0, len(row))
        ids[r, span], mask[r, span] = row, 1
    with torch.no_grad():
        got = model(ids, mask)["sentence_embedding"]
        for r, row in enumerate(rows):
            vector = _reference(pooling, _alone(model, row))
            assert torch.allclose(got[r], vector / vector.norm(), atol=1e-5), (r, side)
    assert torch.allclose(got.norm(dim=1), torch.ones(3), atol=1e-6)


def test_classifier_reads_the_pooled_vector() -> None:
    """BertForSequenceClassification's formula: W_c tanh(W_p h_0 + b_p) + b_c."""
    resolved = card("bert-tiny", pooling="pooler", num_labels=4, mlm_head=False)
    model = build_model(resolved, seed=3)
    ids = random_ids(resolved, 2, 6)
    with torch.no_grad():
        out = model(ids, torch.ones_like(ids))
        first = out["last_hidden_state"][:, 0]
        pooled = torch.tanh(F.linear(first, model.pooler.dense.weight, model.pooler.dense.bias))
        expected = F.linear(pooled, model.classifier.linear.weight, model.classifier.linear.bias)
    assert out["logits"].shape == (2, 4)
    assert torch.allclose(out["logits"], expected, atol=1e-6)


def test_decoder_classifier_has_no_lm_head_and_no_cache() -> None:
    model = build_model(card("gpt-tiny", **DECODER_CLASSIFIER))
    ids = random_ids(card("gpt-tiny"), 2, 5)
    out = model(ids, torch.ones_like(ids))
    assert model.head is None
    assert list(out) == ["last_hidden_state", "sentence_embedding", "logits"]
    assert out["logits"].shape == (2, 3)
