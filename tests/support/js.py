"""Node.js, headless Chromium and transformers.js as the client tests drive them: where the
examples' packages are, why a test skips, the page served, and Python's tokens to compare with."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from functools import partial
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import urlencode

import numpy as np
import pytest
from click.testing import CliRunner

from cli import main as zoo
from export.opening import open_export, open_model
from export.torch_engine import TorchEngine
from runtime.generate import generate
from runtime.sessions import Runtime
from zoo.files.weights import load_built

ROOT = Path(__file__).resolve().parents[2]
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


def zoo_run_text(folder: Path, text: str, steps: int) -> str:
    """What `zoo run FOLDER --text TEXT` prints (greedy): the reference for Node and the page."""
    result = CliRunner().invoke(zoo, ["run", str(folder), "--text", text,
                                      "--max-new-tokens", str(steps)])
    assert result.exit_code == 0, result.output
    return result.stdout


def engines(folder: Path) -> tuple[Runtime, TorchEngine]:
    return open_export(folder), open_model(*load_built(folder))


def node_generate(folder: Path, ids: list[int], steps: int | None = None) -> dict:
    args = [str(folder), "--ids", ",".join(map(str, ids))]
    result = run_node(NODE_DIR / "generate.mjs", *args,
                      *(["--steps", str(steps)] if steps else []))
    assert result.returncode == 0, result.stderr
    assert result.stderr == ""  # no ONNX Runtime warnings either
    return json.loads(result.stdout)


class QuietHandler(SimpleHTTPRequestHandler):
    def log_message(self, *args: object) -> None:  # keep pytest's output to the test results
        pass


@contextmanager
def serving(root: Path) -> Iterator[str]:
    """`root` over HTTP at the URL yielded, while the block runs. Port 0: the system picks a
    free port; the server runs in this process, so it ends with it."""
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), partial(QuietHandler, directory=str(root)))
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}/"
    finally:
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


@dataclass(frozen=True)
class Page:
    """A page that generates from `ids` (the raw path) or `text`, greedy; `screenshot`: where
    to save it, if anywhere."""
    model: str
    ids: list[int] | None
    steps: int
    text: str | None = None
    screenshot: Path | None = None

    def args(self, server: str) -> list[str]:
        """check-page.mjs's arguments for this page: its URL, then its --screenshot if any."""
        prompt = {"text": self.text} if self.ids is None else {"ids": ",".join(map(str, self.ids))}
        query = urlencode({"model": f"../{self.model}/", **prompt, "steps": self.steps, "run": 1})
        shot = ["--screenshot", str(self.screenshot)] if self.screenshot else []
        return [f"{server}web/index.html?{query}", *shot]


def open_pages(server: str, tmp_path: Path, pages: list[Page]) -> list[dict]:
    """What each page shows, in order, all from one Chromium: a launch takes seconds here, a
    page (a new tab in it) far less."""
    profile = tmp_path / "chromium-profile"  # a new empty user-data-dir for each launch
    profile.mkdir()
    args = [arg for page in pages for arg in page.args(server)]
    # --timeout-ms bounds each page; 20 s more for the launch, as for one page before.
    result = run_node(WEB_DIR / "check-page.mjs", *args, "--user-data-dir", str(profile),
                      "--timeout-ms", "40000", timeout=20 + 40 * len(pages))
    assert result.returncode == 0, result.stderr
    assert processes_using(profile) == [], "Chromium is still running"
    shown = [json.loads(line) for line in result.stdout.splitlines()]
    assert len(shown) == len(pages), result.stdout
    return shown


def open_page(server: str, tmp_path: Path, model: str, ids: list[int] | None, steps: int,
              text: str | None = None, screenshot: Path | None = None) -> dict:
    """What the page shows after generating from `ids` (the raw path) or `text`, greedy."""
    return open_pages(server, tmp_path, [Page(model, ids, steps, text, screenshot)])[0]


SCRIPT = ROOT / "examples" / "transformers-js" / "run.mjs"


def transformers_js_problem() -> str | None:
    if shutil.which("node") is None:
        return "node is not on PATH (Node.js >= 20 runs examples/transformers-js)"
    if not (SCRIPT.parent / "node_modules" / "@huggingface" / "transformers").is_dir():
        return ("examples/transformers-js/node_modules missing: run "
                "`npm ci --ignore-scripts` there (make node-deps)")
    return None

