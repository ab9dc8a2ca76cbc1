"""The exported files run outside Python: examples/node (onnxruntime-node) and the page in
examples/web (onnxruntime-web in headless Chromium) give the tokens and vectors Python gives,
and, from text, the text `zoo run --text` prints (tests/clients/test_tokenizer_js.py: the
tokenizers).

Needs `node`, `npm ci --ignore-scripts` in examples/node and examples/web, and Chromium at
/usr/bin/chromium (or $CHROMIUM); .ci/run installs all three. Where one is missing the tests
skip with the reason, except where ZOO_REQUIRE_NODE_WEB=1 (set by .ci/run): there a missing
piece is a failure, so CI cannot pass by skipping them.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from export.opening import open_export
from runtime.contract import MANIFEST
from runtime.encode import encode
from runtime.files.atomic import sha256
from runtime.files.tokenizer import BYTE_TOKENIZER, HF_TOKENIZER, WORD_TOKENIZER, ByteTokenizer
from runtime.generate import generate
from tests.conftest import Lazy, SharedExport, card, on_shared, prompt_feeds
from tests.support.js import (
    NODE_DIR,
    PROMPTS,
    WEB_DIR,
    Page,
    browser_problem,
    engines,
    node_generate,
    node_problem,
    open_page,
    open_pages,
    python_tokens,
    require,
    run_node,
    serving,
    zoo_run_text,
)

# The tests that read the session's shared exports run in their card's pytest-xdist group, so
# each export is made once (tests/conftest.py: shared_export, on_shared).
pytestmark = on_shared("gpt-tiny")

# Text prompts: ASCII, and characters of 2, 3 and 4 UTF-8 bytes (the random-weight models
# answer with any bytes, invalid UTF-8 included: the decoded text must still match).
TEXTS = ["ROMEO:", "café 東京 🙂"]
# Words for transformer-tiny's 64 ids: the reversal demo's word-tokenizer.json (ids 3..63),
# and a WordLevel tokenizer.json (ids 0..63; the untrained model answers with id 1, which the
# word tokenizer would drop).
WORDS = [f"w{i}" for i in range(64)]


@pytest.fixture(scope="module")
def node_ready() -> None:
    require(node_problem())


@pytest.fixture(scope="module")
def browser_ready() -> None:
    require(browser_problem())


@pytest.fixture(scope="module")
def exported(shared_export: SharedExport) -> Lazy:
    """The tiny cards exported once per session (parity-checked)."""
    return Lazy(("gpt-tiny", "bert-tiny", "transformer-tiny", "llama-tiny"),
                lambda name: shared_export(name)[0])


def with_tokenizer(folder: Path, copy: Path, name: str, content: str) -> Path:
    """A copy of an export with a tokenizer file, listed in its manifest as `zoo export` lists
    the tokenizer it copies from a trained model's folder."""
    copy = Path(shutil.copytree(folder, copy))
    (copy / name).write_text(content, encoding="utf-8")
    manifest = json.loads((copy / MANIFEST).read_text())
    manifest["files"][name] = {"sha256": sha256(copy / name), "bytes": (copy / name).stat().st_size}
    (copy / MANIFEST).write_text(json.dumps(manifest))
    return copy


@pytest.fixture(scope="module")
def with_text(exported: Lazy, tmp_path_factory: pytest.TempPathFactory) -> Lazy:
    """The exports with their tokenizers: the byte tokenizer for gpt-tiny and bert-tiny (what
    a model trained here carries), words for transformer-tiny."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    root = tmp_path_factory.mktemp("with-text")
    words = json.dumps({"kind": "words", "words": WORDS[3:]})
    word_level = Tokenizer(models.WordLevel({w: i for i, w in enumerate(WORDS)}, unk_token="w0"))
    word_level.pre_tokenizer = pre_tokenizers.Whitespace()
    made = {
        "gpt-tiny": lambda: with_tokenizer(exported["gpt-tiny"], root / "gpt", BYTE_TOKENIZER,
                                           ByteTokenizer().to_json()),
        "bert-tiny": lambda: with_tokenizer(exported["bert-tiny"], root / "bert",
                                            BYTE_TOKENIZER, ByteTokenizer().to_json()),
        "transformer-tiny": lambda: with_tokenizer(exported["transformer-tiny"], root / "t2t",
                                                   HF_TOKENIZER, word_level.to_str()),
        "t2t-words": lambda: with_tokenizer(exported["transformer-tiny"], root / "t2t-words",
                                            WORD_TOKENIZER, words),
    }
    return Lazy(made, lambda name: made[name]())


@pytest.mark.parametrize("name, steps", [
    ("gpt-tiny", 64), ("transformer-tiny", 32),
    pytest.param("llama-tiny", 32, marks=on_shared("llama-tiny")),  # a cache of 2 kv heads
])
def test_node_greedy_tokens_equal_python_onnx_runtime_and_pytorch(
        name: str, steps: int, node_ready: None, exported: Lazy) -> None:
    runtime, torch_engine = engines(exported[name])
    for ids in PROMPTS:
        expected = python_tokens(runtime, ids, steps)
        assert python_tokens(torch_engine, ids, steps) == expected
        assert node_generate(exported[name], ids, steps)["tokens"] == expected, ids


@on_shared("bert-tiny")
def test_node_pooled_vector_equals_python(node_ready: None,
                                          exported: Lazy) -> None:
    runtime, _ = engines(exported["bert-tiny"])
    for ids in PROMPTS:
        pooled, _ = encode(runtime, np.array(ids))
        from_node = np.array(node_generate(exported["bert-tiny"], ids)["pooled"])
        assert from_node.shape == (card("bert-tiny")["d_model"],)
        np.testing.assert_allclose(from_node, pooled, rtol=0, atol=1e-5)


@pytest.mark.parametrize("name, text, steps", [
    ("gpt-tiny", TEXTS[0], 64), ("gpt-tiny", TEXTS[1], 40),
    ("transformer-tiny", "w5 w6 w7 w60", 20),
])
def test_node_text_prints_what_zoo_run_prints(name: str, text: str, steps: int,
                                              node_ready: None,
                                              with_text: Lazy) -> None:
    """A decoder prints the prompt and its continuation, an encoder-decoder the translation,
    byte for byte as `zoo run --text` does (the text streamed as tokens come)."""
    expected = zoo_run_text(with_text[name], text, steps)
    result = run_node(NODE_DIR / "generate.mjs", str(with_text[name]), "--text", text,
                      "--steps", str(steps))
    assert result.returncode == 0 and result.stderr == "", result.stderr
    assert result.stdout == expected
    assert len(expected) > len(text) + 5 if name == "gpt-tiny" else expected.strip()


@on_shared("bert-tiny")
def test_node_text_gives_an_encoder_the_pooled_vector_of_its_ids(
        node_ready: None, with_text: Lazy) -> None:
    folder = with_text["bert-tiny"]
    for text in TEXTS:
        pooled, _ = encode(open_export(folder), np.array(list(text.encode("utf-8"))))
        result = run_node(NODE_DIR / "generate.mjs", str(folder), "--text", text)
        assert result.returncode == 0, result.stderr
        np.testing.assert_allclose(json.loads(result.stdout)["pooled"], pooled, rtol=0,
                                   atol=1e-5)


def test_page_sampling_draws_from_the_top_k_softmax(node_ready: None) -> None:
    """examples/web/sampling.mjs, run in Node: temperature 0 is numpy's argmax (the first
    maximum); above 0, the frequencies of 40000 draws match softmax(logits / T) over the top k
    (computed here with numpy), and nothing outside the top k is drawn."""
    logits = [0.5, 2.0, -1.0, 2.0, 1.0, 0.0, 1.5, -3.0]
    script = ("import { pick, seeded } from './sampling.mjs';\n"
              f"const row = Float32Array.from({logits}); const random = seeded(7);\n"
              "const counts = new Array(row.length).fill(0);\n"
              "for (let i = 0; i < 40000; i++) counts[pick(row, {temperature: 0.7, topK: 4}, "
              "random)]++;\n"
              "console.log(JSON.stringify({greedy: pick(row, {temperature: 0}), counts}));")
    done = subprocess.run(["node", "--input-type=module", "-e", script], cwd=WEB_DIR,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert result["greedy"] == int(np.argmax(logits)) == 1
    top = np.argsort(logits)[::-1][:4]
    expected = np.zeros(len(logits))
    weights = np.exp((np.array(logits)[top] - max(logits)) / 0.7)
    expected[top] = weights / weights.sum()
    np.testing.assert_allclose(np.array(result["counts"]) / 40000, expected, atol=0.01)


def newer_format(folder: Path, tmp_path: Path) -> Path:
    copy = Path(shutil.copytree(folder, tmp_path / "newer"))
    manifest = json.loads((copy / MANIFEST).read_text())
    manifest["format_version"] = 2
    (copy / MANIFEST).write_text(json.dumps(manifest))
    return copy


@pytest.mark.parametrize("case, option, value, message", [
    ("empty", "--ids", "1,2", "not an export (no manifest.json)"),
    ("newer", "--ids", "1,2", "format_version=2, this program reads 1"),
    ("gpt", "--ids", "1,260", "token ids should be in 0..259, got 260"),
    ("gpt", "--ids", "-1,5", "token ids should be in 0..259, got -1"),
    ("gpt", "--ids", "1,x", "expected comma-separated integers"),
    ("gpt", "--text", "ROMEO:", "this export has no tokenizer"),
    ("gpt-text", "--text", "", "an empty prompt"),
    ("gpt-text", "--text", "x" * 100, "prompt of 100 plus 32 new tokens exceeds max_positions=128"),
    pytest.param("t2t-text", "--text", "w3 Romeo", "words not in the vocabulary: romeo",
                 marks=on_shared("transformer-tiny")),
])
def test_node_bad_input_exits_non_zero_with_one_line(case: str, option: str, value: str,
                                                     message: str, node_ready: None,
                                                     exported: Lazy,
                                                     with_text: Lazy,
                                                     tmp_path: Path) -> None:
    folder = {"empty": lambda: tmp_path, "gpt": lambda: exported["gpt-tiny"],
              "gpt-text": lambda: with_text["gpt-tiny"],
              "t2t-text": lambda: with_text["t2t-words"],
              "newer": lambda: newer_format(exported["gpt-tiny"], tmp_path)}[case]()
    result = run_node(NODE_DIR / "generate.mjs", str(folder), option, value)
    assert result.returncode != 0
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and message in lines[0], result.stderr
    assert result.stdout == ""


@pytest.fixture(scope="module")
def attention_export(browser_ready: None, shared_export: SharedExport) -> Path:
    return shared_export("gpt-tiny", "attentions")[0]


@pytest.fixture(scope="module")
def server(browser_ready: None, exported: Lazy, attention_export: Path,
           with_text: Lazy, tmp_path_factory: pytest.TempPathFactory
           ) -> Iterator[str]:
    """http://127.0.0.1:PORT/ serving a folder laid out as examples/web/README.md says: the page
    (with its node_modules) under web/, and the exports beside it."""
    root = tmp_path_factory.mktemp("web-root")
    (root / "web").symlink_to(WEB_DIR)
    (root / "gpt").symlink_to(exported["gpt-tiny"])
    (root / "gpt-att").symlink_to(attention_export)
    (root / "gpt-text").symlink_to(with_text["gpt-tiny"])
    (root / "empty").mkdir()
    broken = Path(shutil.copytree(with_text["gpt-tiny"], root / "broken"))  # all but one file
    (broken / "onnx/model.onnx").unlink()
    with serving(root) as url:
        yield url


def test_page_generates_the_same_tokens_as_python(server: str, exported: Lazy,
                                                  tmp_path: Path) -> None:
    ids = PROMPTS[0]
    shown = open_page(server, tmp_path, "gpt", ids, 64)
    assert shown["state"] == "done", shown["error"]
    runtime, torch_engine = engines(exported["gpt-tiny"])
    assert shown["tokens"] == python_tokens(runtime, ids, 64)
    assert shown["tokens"] == python_tokens(torch_engine, ids, 64)
    assert "ms per token" in shown["status"]


@on_shared("llama-tiny")
def test_page_generates_a_grouped_query_exports_tokens(browser_ready: None, exported: Lazy,
                                                       tmp_path: Path) -> None:
    """llama-tiny (rotary, RMSNorm, SwiGLU; a cache of 2 key/value heads for 4 query heads,
    sized from the manifest): the page's greedy tokens are Python's."""
    root = tmp_path / "web-root"
    root.mkdir()
    (root / "web").symlink_to(WEB_DIR)
    (root / "llama").symlink_to(exported["llama-tiny"])
    ids = PROMPTS[0]
    with serving(root) as url:
        shown = open_page(url, tmp_path, "llama", ids, 32)
    assert shown["state"] == "done", shown["error"]
    runtime, torch_engine = engines(exported["llama-tiny"])
    assert shown["tokens"] == python_tokens(runtime, ids, 32)
    assert shown["tokens"] == python_tokens(torch_engine, ids, 32)


def test_page_shows_the_text_zoo_run_prints(server: str, with_text: Lazy,
                                            tmp_path: Path) -> None:
    """Text typed on the page gives, greedily, the text `zoo run --text` prints, with the
    speed measured: no more time than the whole page took, and no more than ten times
    Python ONNX Runtime's native tokens/s on one thread (WASM is slower; a timer that missed
    the run would show far more). Each text's screenshot is kept beside the test's files (and in
    $ZOO_ARTIFACTS when set)."""
    runtime = open_export(with_text["gpt-tiny"], "cpu", 1)
    start = time.perf_counter()
    generate(runtime, np.array([PROMPTS[0]]), None, 64)
    native = 64 / (time.perf_counter() - start)
    shots = [tmp_path / f"page-{index}.png" for index in range(len(TEXTS))]
    pages = [Page("gpt-text", None, 64, text, shot)
             for text, shot in zip(TEXTS, shots, strict=True)]
    for text, shot, shown in zip(TEXTS, shots, open_pages(server, tmp_path, pages), strict=True):
        assert shown["state"] == "done", shown["error"]
        assert shown["text"] + "\n" == zoo_run_text(with_text["gpt-tiny"], text, 64)
        assert 0 < shown["tokensPerSecond"] < 10 * native
        assert f"{shown['tokensPerSecond']:.1f} tokens/s" in shown["status"]
        assert 0 < shown["totalMs"] <= shown["wallMs"]
        assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        if os.environ.get("ZOO_ARTIFACTS"):
            shutil.copy(shot, Path(os.environ["ZOO_ARTIFACTS"]) / shot.name)


def test_page_draws_the_attention_python_computes(server: str, attention_export: Path,
                                                  tmp_path: Path) -> None:
    """An --attentions export: the page draws its prompt's last-layer maps, and the numbers
    behind the drawing equal Python ONNX Runtime's on the same graph; a plain export draws
    nothing."""
    ids = PROMPTS[0]
    shown, plain = open_pages(server, tmp_path, [Page("gpt-att", ids, 4), Page("gpt", ids, 4)])
    assert shown["state"] == "done", shown
    tiny = card("gpt-tiny")
    layer = tiny["n_layers"] - 1
    drawn = shown["attention"]
    assert drawn["layer"] == layer and drawn["tokens"] == ids
    outputs = open_export(attention_export).run("onnx/model.onnx", prompt_feeds(tiny, ids))
    np.testing.assert_allclose(np.asarray(drawn["heads"]), outputs[f"attentions.{layer}"][0],
                               atol=1e-5)
    assert plain["attention"] is None


# Each a page that must show its error (the message, in it) rather than hang.
ERROR_PAGES = {
    "no-manifest": (Page("empty", None, 8, "ROMEO:"),
                    "not an export (no manifest.json: HTTP 404)"),
    "missing-file": (Page("broken", None, 8, "ROMEO:"), "model.onnx: HTTP 404"),
    "id-out-of-range": (Page("gpt", [1, 999], 8), "token ids should be in 0..259, got 999"),
    "no-tokenizer": (Page("gpt", None, 8, "ROMEO:"), "this export has no tokenizer"),
    "too-long": (Page("gpt-text", None, 8, "x" * 121),
                 "prompt of 121 tokens plus 8 new tokens: should be at least one new token and "
                 "at most max_positions=128"),
}


@pytest.fixture(scope="module")
def error_pages_shown(server: str, tmp_path_factory: pytest.TempPathFactory
                      ) -> dict[str, dict]:
    """What each of ERROR_PAGES shows, by case, all from one Chromium launch."""
    pages = [page for page, _ in ERROR_PAGES.values()]
    shown = open_pages(server, tmp_path_factory.mktemp("error-pages"), pages)
    return dict(zip(ERROR_PAGES, shown, strict=True))


@pytest.mark.parametrize("case", ERROR_PAGES)
def test_page_shows_the_error_instead_of_hanging(case: str,
                                                 error_pages_shown: dict[str, dict]) -> None:
    shown, (_, message) = error_pages_shown[case], ERROR_PAGES[case]
    assert shown["state"] == "error" and shown["tokens"] == [] and shown["text"] == ""
    assert shown["error"].startswith("error: ") and message in shown["error"]
