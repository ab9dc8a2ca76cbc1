"""examples/node (onnxruntime-node) runs quantized exports, whose graph is stored under
transformers.js's name for its dtype (onnx/model_q4.onnx, model_int8, model_quantized; found
through the manifest's quantization.stored_as), and gives what `zoo run` gives on them: the
same greedy tokens, and the same labels and probabilities for the same batch."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

import cli
from export.opening import open_export
from tests.conftest import ON_HF_CLIENTS, Lazy
from tests.support.hf_exports import TEXTS, TRANSLATIONS, TRANSLATOR
from tests.support.js import (
    NODE_DIR,
    PROMPTS,
    node_generate,
    node_problem,
    python_tokens,
    require,
    run_node,
)

pytestmark = ON_HF_CLIENTS  # the exports of tests/support/hf_exports.py, made once in that group


@pytest.fixture(scope="module")
def exports(hf_client_exports: Lazy) -> Lazy:
    require(node_problem())
    return hf_client_exports


@pytest.mark.parametrize("key, graph", [("gpt-q4", "onnx/model_q4.onnx"),
                                        ("gpt-int8", "onnx/model_int8.onnx")])
def test_generate_mjs_gives_zoo_runs_tokens(key: str, graph: str, exports: Lazy) -> None:
    folder: Path = exports[key]
    assert not (folder / "onnx" / "model.onnx").exists() and (folder / graph).is_file()
    runtime = open_export(folder)
    for ids in PROMPTS:
        assert node_generate(folder, ids, 24)["tokens"] == python_tokens(runtime, ids, 24), ids


def test_classify_mjs_gives_zoo_runs_labels_and_probabilities(exports: Lazy) -> None:
    folder = exports["classifier-q8"]
    args = [arg for text in TEXTS for arg in ("--text", text)]
    python = CliRunner().invoke(cli.main, ["run", str(folder), "--json", *args])
    assert python.exit_code == 0, python.output
    expected = json.loads(python.output)
    result = run_node(NODE_DIR / "classify.mjs", str(folder), *args)
    assert result.returncode == 0 and result.stderr == "", result.stderr
    got = json.loads(result.stdout)
    assert got["labels"] == expected["labels"]
    np.testing.assert_allclose(got["probabilities"], expected["probabilities"], atol=1e-5)


@pytest.mark.parametrize("key", [TRANSLATOR])
def test_generate_mjs_translates_from_text_as_zoo_run_does(key: str, exports: Lazy) -> None:
    """A MarianMT export's source through its tokenizer.json (which adds </s> as a special
    token, where Python's sentencepiece files append it): the same translation as zoo run."""
    folder = exports[key]
    for text in TRANSLATIONS:
        python = CliRunner().invoke(cli.main, ["run", str(folder), "--text", text,
                                               "--max-new-tokens", "24"])
        assert python.exit_code == 0, python.output
        result = run_node(NODE_DIR / "generate.mjs", str(folder), "--text", text,
                          "--steps", "24")
        assert result.returncode == 0, result.stderr
        assert result.stdout.strip() == python.output.strip(), text
