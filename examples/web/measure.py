"""Tokens/s of the page (ONNX Runtime Web, WASM, one thread, headless Chromium) beside Python
ONNX Runtime (one thread) on the same exports, in one run, for BENCHMARKS.md:

    python examples/web/measure.py EXPORT [EXPORT ...] [--steps 32]

Both generate greedily from the same 8-token prompt; the rate is that of the steps after the
first (one new token each), the first step (the whole prompt) is shown apart. Prints the CPU,
the versions and a Markdown table.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import threading
import time
from functools import partial
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import numpy as np

WEB = Path(__file__).resolve().parent
sys.path.insert(0, str(WEB.parents[1]))  # the zoo, when run from a checkout

from export.bench.machine import cpu_name  # noqa: E402
from export.opening import open_export  # noqa: E402
from runtime.generate import generate  # noqa: E402

PROMPT = [72, 101, 108, 108, 111, 44, 32, 119]


class Quiet(SimpleHTTPRequestHandler):
    def log_message(self, *args: object) -> None:
        pass


def page(url: str, folder: str, steps: int) -> dict:
    query = f"model=../{folder}/&ids={','.join(map(str, PROMPT))}&steps={steps}&run=1"
    done = subprocess.run(["node", "check-page.mjs", f"{url}web/index.html?{query}",
                           "--timeout-ms", "600000"], cwd=WEB, capture_output=True, text=True,
                          check=True)
    shown = json.loads(done.stdout)
    assert shown["state"] == "done", shown["error"]
    return shown


def python(folder: Path, steps: int) -> tuple[float, float, list[int]]:
    """(first step ms, tokens/s after it, tokens), best of three, one thread."""
    runtime = open_export(folder, "cpu", 1)
    ids = np.array([PROMPT])

    def timed(n: int) -> tuple[float, list[int]]:
        start = time.perf_counter()
        tokens = generate(runtime, ids, None, n, eos=None)[0].tolist()
        return time.perf_counter() - start, tokens

    first = min(timed(1)[0] for _ in range(3))
    whole, tokens = min(timed(steps) for _ in range(3))
    return 1000 * first, (steps - 1) / (whole - first), tokens


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("exports", nargs="+", type=Path)
    parser.add_argument("--steps", type=int, default=32)
    args = parser.parse_args()
    import onnxruntime

    chromium = subprocess.run(["/usr/bin/chromium", "--version"], capture_output=True,
                              text=True).stdout.strip()
    web_ort = json.loads((WEB / "node_modules/onnxruntime-web/package.json").read_text())
    print(f"CPU: {cpu_name()}; Python onnxruntime {onnxruntime.__version__}; {chromium}; "
          f"onnxruntime-web {web_ort['version']} (WASM, one thread); node "
          f"{subprocess.run(['node', '--version'], capture_output=True, text=True).stdout.strip()}")
    with tempfile.TemporaryDirectory() as root:
        (Path(root) / "web").symlink_to(WEB)
        for index, folder in enumerate(args.exports):
            (Path(root) / f"m{index}").symlink_to(folder.resolve())
        httpd = ThreadingHTTPServer(("127.0.0.1", 0), partial(Quiet, directory=root))
        threading.Thread(target=httpd.serve_forever, daemon=True).start()
        url = f"http://127.0.0.1:{httpd.server_address[1]}/"
        print(f"\nprompt of {len(PROMPT)} tokens, {args.steps} new tokens, greedy\n")
        print("| export | Python ORT: first step | Python ORT tokens/s | page: first step "
              "| page tokens/s | page / Python | same tokens |")
        print("| --- | --- | --- | --- | --- | --- | --- |")
        for index, folder in enumerate(args.exports):
            first, rate, tokens = python(folder, args.steps)
            shown = page(url, f"m{index}", args.steps)
            page_rate = shown["tokensPerSecond"]
            made = shown["tokens"]  # the page stops at eos; Python here does not
            page_first = shown["totalMs"] - (len(made) - 1) * 1000 / page_rate
            print(f"| {folder.name} | {first:.1f} ms | {rate:.1f} | {page_first:.1f} ms "
                  f"| {page_rate:.1f} | {page_rate / rate:.2f} | {made == tokens[:len(made)]} |",
                  flush=True)
        httpd.shutdown()


if __name__ == "__main__":
    main()
