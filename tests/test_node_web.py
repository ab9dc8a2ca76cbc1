"""The exported files run outside Python: examples/node (onnxruntime-node) and the page in
examples/web (onnxruntime-web in headless Chromium) give the tokens and vectors Python gives.

Needs `node`, `npm ci --ignore-scripts` in examples/node and examples/web, and Chromium at
/usr/bin/chromium (or $CHROMIUM); .ci/run installs all three. Where one is missing the tests
skip with the reason, except where ZOO_REQUIRE_NODE_WEB=1 (set by .ci/run): there a missing
piece is a failure, so CI cannot pass by skipping them.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import threading
from collections.abc import Iterator
from functools import partial
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import numpy as np
import pytest

from export.onnx.contract import MANIFEST
from export.runtime.encode import encode
from export.runtime.engines import TorchEngine
from export.runtime.generate import generate
from export.runtime.sessions import Runtime
from tests.conftest import SharedExport, card, prompt_feeds
from zoo.files.weights import load_built

ROOT = Path(__file__).resolve().parents[1]
# The tests that read the session's shared exports run in one pytest-xdist worker, so each
# export is made once (tests/conftest.py: shared_export).
pytestmark = pytest.mark.xdist_group("shared-exports")

NODE_DIR = ROOT / "examples" / "node"
WEB_DIR = ROOT / "examples" / "web"
CHROMIUM = os.environ.get("CHROMIUM", "/usr/bin/chromium")
# Prompts below every vocabulary (transformer-tiny has 64 ids); [7]: one token, past length 0.
PROMPTS = [[40, 41, 42, 43, 44], [7], [3, 1, 4, 1, 5, 9, 2, 6]]


def require(problem: str | None) -> None:
    if problem is None:
        return
    if os.environ.get("ZOO_REQUIRE_NODE_WEB") == "1":
        pytest.fail(f"{problem} (ZOO_REQUIRE_NODE_WEB=1: these tests must run here)")
    pytest.skip(problem)


def node_problem() -> str | None:
    if shutil.which("node") is None:
        return "node is not on PATH (Node.js >= 20 runs examples/node)"
    if not (NODE_DIR / "node_modules" / "onnxruntime-node").is_dir():
        return "examples/node/node_modules missing: run `npm ci --ignore-scripts` there"
    return None


def browser_problem() -> str | None:
    if shutil.which("node") is None:
        return "node is not on PATH (it drives Chromium with playwright-core)"
    for package in ("onnxruntime-web", "playwright-core"):
        if not (WEB_DIR / "node_modules" / package).is_dir():
            return (f"examples/web/node_modules/{package} missing: run "
                    "`npm ci --ignore-scripts` there")
    if not os.access(CHROMIUM, os.X_OK):
        return f"{CHROMIUM} missing: apt-get install chromium (or set $CHROMIUM)"
    return None


def run_node(script: Path, *args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    """Run a Node program; on a timeout send SIGTERM first, so playwright closes its browser
    (which it starts in a process group of its own) before the program goes."""
    process = subprocess.Popen(["node", script.name, *args], cwd=script.parent, text=True,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        stdout, stderr = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        process.send_signal(signal.SIGTERM)
        try:
            process.communicate(timeout=10)
        finally:
            process.kill()
            process.wait()
        pytest.fail(f"node {script.name} {' '.join(args)}: no answer within {timeout} s")
    return subprocess.CompletedProcess(process.args, process.returncode, stdout, stderr)


def python_tokens(engine: Runtime | TorchEngine, ids: list[int], steps: int) -> list[int]:
    """Greedy tokens as `zoo run` gives them: up to and including the first eos."""
    eos = engine.card["eos_token_id"]
    tokens = generate(engine, np.array([ids]), None, steps, eos=eos)[0].tolist()
    return tokens[: tokens.index(eos) + 1] if eos in tokens else tokens


@pytest.fixture(scope="module")
def node_ready() -> None:
    require(node_problem())


@pytest.fixture(scope="module")
def browser_ready() -> None:
    require(browser_problem())


@pytest.fixture(scope="module")
def exported(shared_export: SharedExport) -> dict[str, Path]:
    """gpt-tiny, bert-tiny and transformer-tiny exported once per session (parity-checked)."""
    return {name: shared_export(name)[0] for name in ("gpt-tiny", "bert-tiny", "transformer-tiny")}


def engines(folder: Path) -> tuple[Runtime, TorchEngine]:
    return Runtime(folder), TorchEngine(*load_built(folder))


def node_generate(folder: Path, ids: list[int], steps: int | None = None) -> dict:
    args = [str(folder), "--ids", ",".join(map(str, ids))]
    result = run_node(NODE_DIR / "generate.mjs", *args,
                      *(["--steps", str(steps)] if steps else []))
    assert result.returncode == 0, result.stderr
    assert result.stderr == ""  # no ONNX Runtime warnings either
    return json.loads(result.stdout)


@pytest.mark.parametrize("name, steps", [("gpt-tiny", 64), ("transformer-tiny", 32)])
def test_node_greedy_tokens_equal_python_onnx_runtime_and_pytorch(
        name: str, steps: int, node_ready: None, exported: dict[str, Path]) -> None:
    runtime, torch_engine = engines(exported[name])
    for ids in PROMPTS:
        expected = python_tokens(runtime, ids, steps)
        assert python_tokens(torch_engine, ids, steps) == expected
        assert node_generate(exported[name], ids, steps)["tokens"] == expected, ids


def test_node_pooled_vector_equals_python(node_ready: None,
                                          exported: dict[str, Path]) -> None:
    runtime, _ = engines(exported["bert-tiny"])
    for ids in PROMPTS:
        pooled, _ = encode(runtime, np.array(ids))
        from_node = np.array(node_generate(exported["bert-tiny"], ids)["pooled"])
        assert from_node.shape == (card("bert-tiny")["d_model"],)
        np.testing.assert_allclose(from_node, pooled, rtol=0, atol=1e-5)


def newer_format(folder: Path, tmp_path: Path) -> Path:
    copy = Path(shutil.copytree(folder, tmp_path / "newer"))
    manifest = json.loads((copy / MANIFEST).read_text())
    manifest["format_version"] = 2
    (copy / MANIFEST).write_text(json.dumps(manifest))
    return copy


@pytest.mark.parametrize("case, ids, message", [
    ("empty", "1,2", "not an export (no manifest.json)"),
    ("newer", "1,2", "format_version=2, this program reads 1"),
    ("gpt", "1,260", "token ids should be in 0..259, got 260"),
    ("gpt", "-1,5", "token ids should be in 0..259, got -1"),
    ("gpt", "1,x", "expected comma-separated integers"),
])
def test_node_bad_input_exits_non_zero_with_one_line(case: str, ids: str, message: str,
                                                     node_ready: None,
                                                     exported: dict[str, Path],
                                                     tmp_path: Path) -> None:
    folder = {"empty": lambda: tmp_path, "gpt": lambda: exported["gpt-tiny"],
              "newer": lambda: newer_format(exported["gpt-tiny"], tmp_path)}[case]()
    result = run_node(NODE_DIR / "generate.mjs", str(folder), "--ids", ids)
    assert result.returncode != 0
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and message in lines[0], result.stderr
    assert result.stdout == ""


class QuietHandler(SimpleHTTPRequestHandler):
    def log_message(self, *args: object) -> None:  # keep pytest's output to the test results
        pass


@pytest.fixture(scope="module")
def attention_export(browser_ready: None, shared_export: SharedExport) -> Path:
    return shared_export("gpt-tiny", "attentions")[0]


@pytest.fixture(scope="module")
def server(browser_ready: None, exported: dict[str, Path], attention_export: Path,
           tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """http://127.0.0.1:PORT/ serving a folder laid out as examples/web/README.md says: the page
    (with its node_modules) under web/, and the exports beside it."""
    root = tmp_path_factory.mktemp("web-root")
    (root / "web").symlink_to(WEB_DIR)
    (root / "gpt").symlink_to(exported["gpt-tiny"])
    (root / "gpt-att").symlink_to(attention_export)
    (root / "empty").mkdir()
    broken = Path(shutil.copytree(exported["gpt-tiny"], root / "broken"))
    (broken / "model.onnx").unlink()
    # Port 0: the system picks a free port; the server runs in this process, so it ends with it.
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), partial(QuietHandler, directory=str(root)))
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}/"
    httpd.shutdown()
    httpd.server_close()
    thread.join()


def processes_using(path: Path) -> list[str]:
    found = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            if str(path).encode() in cmdline.read_bytes():
                found.append(cmdline.parent.name)
        except OSError:  # the process ended while we looked
            continue
    return found


def open_page(server: str, tmp_path: Path, model: str, ids: list[int], steps: int) -> dict:
    profile = tmp_path / "chromium-profile"  # a new empty user-data-dir for each page
    profile.mkdir()
    query = f"model=../{model}/&ids={','.join(map(str, ids))}&steps={steps}&run=1"
    result = run_node(WEB_DIR / "check-page.mjs", f"{server}web/index.html?{query}",
                      "--user-data-dir", str(profile), "--timeout-ms", "40000")
    assert result.returncode == 0, result.stderr
    assert processes_using(profile) == [], "Chromium is still running"
    return json.loads(result.stdout)


def test_page_generates_the_same_tokens_as_python(server: str, exported: dict[str, Path],
                                                  tmp_path: Path) -> None:
    ids = PROMPTS[0]
    shown = open_page(server, tmp_path, "gpt", ids, 64)
    assert shown["state"] == "done", shown["error"]
    runtime, torch_engine = engines(exported["gpt-tiny"])
    assert shown["tokens"] == python_tokens(runtime, ids, 64)
    assert shown["tokens"] == python_tokens(torch_engine, ids, 64)
    assert "ms per token" in shown["status"]


def test_page_draws_the_attention_python_computes(server: str, attention_export: Path,
                                                  tmp_path: Path) -> None:
    """An --attentions export: the page draws its prompt's last-layer maps, and the numbers
    behind the drawing equal Python ONNX Runtime's on the same graph; a plain export draws
    nothing."""
    ids = PROMPTS[0]
    shown = open_page(server, tmp_path, "gpt-att", ids, 4)
    assert shown["state"] == "done", shown
    tiny = card("gpt-tiny")
    layer = tiny["n_layers"] - 1
    drawn = shown["attention"]
    assert drawn["layer"] == layer and drawn["tokens"] == ids
    outputs = Runtime(attention_export).run("model.onnx", prompt_feeds(tiny, ids))
    np.testing.assert_allclose(np.asarray(drawn["heads"]), outputs[f"attentions.{layer}"][0],
                               atol=1e-5)
    plain = tmp_path / "plain"
    plain.mkdir()
    assert open_page(server, plain, "gpt", ids, 4)["attention"] is None


@pytest.mark.parametrize("model, ids, message", [
    ("empty", [1, 2], "not an export (no manifest.json: HTTP 404)"),
    ("broken", [1, 2], "model.onnx: HTTP 404"),
    ("gpt", [1, 999], "token ids should be in 0..259, got 999"),
])
def test_page_shows_the_error_instead_of_hanging(model: str, ids: list[int], message: str,
                                                 server: str, tmp_path: Path) -> None:
    shown = open_page(server, tmp_path, model, ids, 8)
    assert shown["state"] == "error" and shown["tokens"] == []
    assert shown["error"].startswith("error: ") and message in shown["error"]
