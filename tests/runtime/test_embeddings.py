"""Exported sentence vectors and classifiers (issue #11): the graph's outputs and names, and
`zoo run --text/--ids` against each text computed alone in PyTorch with the formulas here."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from runtime.manifest import read_manifest
from tests.conftest import BERT_CLASSIFIER, CLASSIFIER_SEED, ON_CLASSIFIER, export_card
from tests.support.embeddings import PROMPTS, reference
from tests.support.helpers import assert_one_line_error, zoo, zoo_ok

pytestmark = ON_CLASSIFIER  # the worker that makes classifier_export once


def test_export_declares_the_optimum_names(classifier_export: Path) -> None:
    graph = read_manifest(classifier_export)["graphs"]["onnx/model.onnx"]
    assert graph["outputs"] == ["last_hidden_state", "pooler_output", "sentence_embedding",
                                "logits"]
    import onnx

    model = onnx.load(str(classifier_export / "onnx/model.onnx"))
    shapes = {o.name: [d.dim_param or d.dim_value for d in o.type.tensor_type.shape.dim]
              for o in model.graph.output}
    assert shapes["sentence_embedding"] == ["batch_size", 64]
    assert shapes["logits"] == ["batch_size", 3]


def test_run_json_matches_each_text_alone(classifier_export: Path) -> None:
    """A right-padded batch through ONNX Runtime equals every prompt computed unpadded."""
    out = zoo_ok("run", str(classifier_export), "--json",
                 *[arg for p in PROMPTS for arg in ("--ids", ",".join(map(str, p)))])
    data = json.loads(out)
    vectors, probabilities = reference("bert-tiny", BERT_CLASSIFIER, seed=CLASSIFIER_SEED)
    np.testing.assert_allclose(data["embeddings"], vectors, atol=1e-5)
    np.testing.assert_allclose(data["probabilities"], probabilities, atol=1e-5)
    np.testing.assert_allclose(data["norms"], 1.0, atol=1e-5)
    np.testing.assert_allclose(data["cosine"], vectors @ vectors.T, atol=1e-5)
    assert data["labels"] == ["low", "mid", "high"]


def test_run_prints_top_labels_and_similarities(classifier_export: Path) -> None:
    out = zoo_ok("run", str(classifier_export), "--ids", "72,101", "--ids", "5,6,7")
    _, probabilities = reference("bert-tiny", BERT_CLASSIFIER, seed=CLASSIFIER_SEED)
    lines = out.splitlines()
    assert lines[0] == "[0] '72,101'"
    names = [name for name, _ in (part.split() for part in lines[1].strip().split(", "))]
    assert sorted(names) == ["high", "low", "mid"]
    shown = [float(part.split()[1]) for part in lines[1].strip().split(", ")]
    assert shown == sorted(shown, reverse=True) and abs(sum(shown) - 1) < 2e-3
    assert lines[4] == "cosine similarity:"
    assert lines[5].split()[1] == "+1.0000"


def test_run_refuses_a_prompt_longer_than_max_positions(classifier_export: Path) -> None:
    result = zoo("run", classifier_export, "--ids", ",".join(["5"] * 129))
    assert_one_line_error(result, "a prompt of 129 tokens exceeds max_positions=128")


def test_run_refuses_json_for_a_generator(tmp_path: Path) -> None:
    assert_one_line_error(zoo("run", tmp_path, "--ids", "1", "--json"))


@pytest.mark.slow
def test_decoder_embedder_export_and_run(tmp_path: Path) -> None:
    """A GPT-style mean-pooled embedder exports without cache and matches the formula."""
    overrides = {"pooling": "mean", "normalize": True}
    folder = export_card(tmp_path, "gpt-tiny", overrides, seed=2)
    graph = read_manifest(folder)["graphs"]["onnx/model.onnx"]
    assert graph == {"inputs": ["input_ids", "attention_mask"],
                     "outputs": ["last_hidden_state", "sentence_embedding"]}
    data = json.loads(zoo_ok("run", str(folder), "--json",
                             *[arg for p in PROMPTS for arg in ("--ids", ",".join(map(str, p)))]))
    vectors, _ = reference("gpt-tiny", overrides, seed=2)
    np.testing.assert_allclose(data["embeddings"], vectors, atol=1e-5)
    assert "probabilities" not in data


def test_evaluate_scores_the_export_and_compares_with_pytorch(classifier_export: Path,
                                                              tmp_path: Path) -> None:
    """Rows labelled with the reference's answer twice and a wrong one once: accuracy 2/3."""
    import shutil

    from runtime.files.tokenizer import BYTE_TOKENIZER, ByteTokenizer

    folder = tmp_path / "export"
    shutil.copytree(classifier_export, folder)
    (folder / BYTE_TOKENIZER).write_text(ByteTokenizer().to_json())
    _, probabilities = reference("bert-tiny", BERT_CLASSIFIER, seed=CLASSIFIER_SEED)
    best = probabilities.argmax(1)
    names = BERT_CLASSIFIER["labels"]
    labels = [names[best[0]], names[best[1]], names[(best[2] + 1) % 3]]
    rows = [{"text": bytes(prompt).decode(), "label": label}
            for prompt, label in zip(PROMPTS, labels, strict=True)]
    data = tmp_path / "rows.jsonl"
    data.write_text("".join(json.dumps(row) + "\n" for row in rows))
    out = zoo_ok("evaluate", str(folder), "--data", str(data))
    assert "3 rows: accuracy 0.667" in out
    assert "the same prediction as PyTorch on 3 of 3" in out
