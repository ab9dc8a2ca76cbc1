"""examples/node/classify.mjs (onnxruntime-node) gives the labels, probabilities, vectors and
cosine similarities `zoo run --json` gives, for an encoder classifier and a decoder embedder,
from ids and from text (the byte tokenizer a model trained here carries)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

import cli
from export.pipeline import export_and_verify
from runtime.files.tokenizer import BYTE_TOKENIZER, ByteTokenizer
from tests.conftest import ON_CLASSIFIER, card
from tests.support.js import NODE_DIR, node_problem, require, run_node
from zoo.assemble import build_model

ROWS = ["72,101,108,108,111", "5,6,7", "72,101,108,108,111,33,33,33,33"]
TEXTS = ["Either you must", "Confess yourselves wondrous malicious,", "Or be accusé 東 🙂"]
EMBEDDER = card("gpt-tiny", pooling="last", normalize=True)
MODELS = ["bert-classifier", "gpt-embedder"]
pytestmark = ON_CLASSIFIER  # classifier_export is made once, in the worker of that group


@pytest.fixture(scope="module")
def exported(tmp_path_factory: pytest.TempPathFactory, classifier_export: Path
             ) -> dict[str, Path]:
    require(node_problem())
    root = tmp_path_factory.mktemp("node-classify")
    folders = {key: root / key for key in MODELS}
    shutil.copytree(classifier_export, folders["bert-classifier"])
    export_and_verify(build_model(EMBEDDER, seed=1), EMBEDDER, folders["gpt-embedder"])
    for folder in folders.values():
        (folder / BYTE_TOKENIZER).write_text(ByteTokenizer().to_json())  # for --text
    return folders


@pytest.mark.parametrize("option", ["--ids", "--text"])
@pytest.mark.parametrize("key", MODELS)
def test_node_classify_equals_zoo_run(key: str, option: str, exported: dict[str, Path]) -> None:
    args = [arg for row in (ROWS if option == "--ids" else TEXTS) for arg in (option, row)]
    python = CliRunner().invoke(cli.main, ["run", str(exported[key]), "--json", *args])
    assert python.exit_code == 0, python.output
    expected = json.loads(python.output)
    result = run_node(NODE_DIR / "classify.mjs", str(exported[key]), *args)
    assert result.returncode == 0 and result.stderr == "", result.stderr
    got = json.loads(result.stdout)
    for field in ("embeddings", "norms", "cosine", "probabilities"):
        if field in expected:
            np.testing.assert_allclose(got[field], expected[field], atol=1e-5, err_msg=field)
    assert ("probabilities" in got) == ("probabilities" in expected)
    assert got.get("labels") == expected.get("labels")
    if "probabilities" in got:  # the same top label per row
        assert np.argmax(got["probabilities"], 1).tolist() == np.argmax(
            expected["probabilities"], 1).tolist()


def test_node_classify_refuses_a_generator_export(tmp_path: Path) -> None:
    """A manifest whose graph has no sentence vector (a plain decoder's) is one line, exit 2."""
    require(node_problem())
    manifest = {"format_version": 1, "name": "gpt-tiny", "family": "decoder",
                "card": card("gpt-tiny").fields, "files": {},
                "graphs": {"onnx/model.onnx": {"inputs": ["input_ids"], "outputs": ["logits"]}}}
    (tmp_path / "manifest.json").write_text(json.dumps(manifest))
    result = run_node(NODE_DIR / "classify.mjs", str(tmp_path), "--ids", "1,2")
    assert result.returncode == 2
    assert result.stderr.startswith("error: ") and "no sentence_embedding output" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1
