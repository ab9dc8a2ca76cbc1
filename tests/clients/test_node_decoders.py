"""examples/node/generate.mjs (onnxruntime-node on the plain graph, onnx/model.onnx) on `zoo
import`s of random transformers models (tests/support/decoder_folders.py): a Gemma 3, whose local
layers' window of 4 every prompt reaches past and the new tokens cross many times, and a
Qwen3-MoE. Node gives `zoo run`'s greedy tokens from the ids (Python ONNX Runtime's loop) and
prints, from the text, what `zoo run --text` prints. The page does the same in
tests/clients/test_transformers_js_page.py. Slow: the Gemma 3 exported with --optimize, where `zoo
run` decodes with onnx/model_kv.onnx (GroupQueryAttention, the window as its local_window_size) and
Node and the page with onnx/model.onnx (the window in the traced mask): the same tokens.

Needs what tests/clients/test_node_web.py's Node tests need; skips without it, except under
ZOO_REQUIRE_NODE_WEB=1."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from export.opening import open_export
from runtime.contract import MANIFEST
from tests.conftest import ON_HF_CLIENTS, Lazy
from tests.support.decoder_folders import FOLDERS, GEMMA3
from tests.support.helpers import zoo_ok
from tests.support.hf_exports import TEXTS, built_model
from tests.support.js import (
    NODE_DIR,
    WEB_DIR,
    browser_problem,
    node_generate,
    node_problem,
    open_page,
    python_tokens,
    require,
    run_node,
    serving,
    zoo_run_text,
)
from zoo import load

pytestmark = ON_HF_CLIENTS  # the exports of tests/support/hf_exports.py, made once in that group
STEPS = 32


@pytest.mark.parametrize("key", FOLDERS)
def test_node_generates_zoo_runs_tokens_and_text(key: str, hf_client_exports: Lazy) -> None:
    require(node_problem())
    folder = hf_client_exports[key]
    runtime, tokenizer = open_export(folder), load(folder).tokenizer
    for text in TEXTS:
        ids = tokenizer.encode(text)
        assert node_generate(folder, ids, STEPS)["tokens"] == python_tokens(runtime, ids, STEPS)
    text = TEXTS[-1]  # ids compared above: a random model's bytes decode with replacements
    result = run_node(NODE_DIR / "generate.mjs", str(folder), "--text", text,
                      "--steps", str(STEPS))
    assert result.returncode == 0 and result.stderr == "", result.stderr
    assert result.stdout == zoo_run_text(folder, text, STEPS)


@pytest.mark.slow  # an export of its own (tens of seconds)
def test_node_and_the_page_give_an_optimized_gemma_3_exports_tokens(
        hf_client_exports: Lazy, tmp_path: Path) -> None:
    require(node_problem())
    require(browser_problem())
    built = built_model(hf_client_exports[GEMMA3].parent, GEMMA3, seed=1)  # exported above
    folder = tmp_path / "optimized"
    zoo_ok("export", built, "--onnx", "--optimize", "-o", folder)
    manifest = json.loads((folder / MANIFEST).read_text(encoding="utf-8"))
    assert manifest["generation"]["file"] == "onnx/model_kv.onnx"  # what zoo run decodes with
    runtime = open_export(folder)
    assert runtime.kv_graph is not None
    ids = list(TEXTS[-1].encode("utf-8"))  # the byte-level tokenizer's ids: 23, past the window
    expected = python_tokens(runtime, ids, STEPS)
    assert node_generate(folder, ids, STEPS)["tokens"] == expected
    root = tmp_path / "web-root"
    root.mkdir()
    (root / "web").symlink_to(WEB_DIR)
    (root / "gemma").symlink_to(folder)
    with serving(root) as url:
        shown = open_page(url, tmp_path, "gemma", ids, STEPS)
    assert shown["state"] == "done", shown["error"]
    assert shown["tokens"] == expected
