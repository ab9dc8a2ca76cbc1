"""examples/node/generate.mjs (onnxruntime-node on the plain graph, onnx/model.onnx) on `zoo
import`s of random transformers models (tests/decoder_folders.py): a Gemma 3, whose local
layers' window of 4 every prompt reaches past and the new tokens cross many times, and a
Qwen3-MoE. Node gives `zoo run`'s greedy tokens from the ids (Python ONNX Runtime's loop) and
prints, from the text, what `zoo run --text` prints. The page does the same in
tests/test_transformers_js_page.py.

Needs what tests/test_node_web.py's Node tests need; skips without it, except under
ZOO_REQUIRE_NODE_WEB=1."""

from __future__ import annotations

import pytest

from export.opening import open_export
from tests.conftest import ON_HF_CLIENTS, Lazy
from tests.decoder_folders import FOLDERS
from tests.hf_exports import TEXTS
from tests.test_node_web import (
    NODE_DIR,
    node_generate,
    node_problem,
    python_tokens,
    require,
    run_node,
    zoo_run_text,
)
from zoo import load

pytestmark = ON_HF_CLIENTS  # the exports of tests/hf_exports.py, made once in that group
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
