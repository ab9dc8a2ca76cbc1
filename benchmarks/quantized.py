"""Quantization measured on a trained model (issue #14): gpt-tiny trained as `make demo` trains
it, but only on the first 90% of the shipped text, exported fp32, int8 and int4 (all
`--optimize`), then each scored with ONNX Runtime on the held-out last 10%, in one run:

    PYTHONPATH=. OMP_NUM_THREADS=1 .venv/bin/python benchmarks/quantized.py \
        --work out/quantized --json quantized.json

Per export: perplexity on the held-out text (windows of 128 tokens, every next-token prediction
scored), top-1 next-token agreement with the fp32 export at those same positions, greedy
tokens/s (prompt 32, 64 new tokens, the shared-cache loop, engines timed interleaved) and the
ONNX files' size. PyTorch's perplexity on the same text checks the fp32 export, and the
untrained model's gives the scale. `make demo` trains on the whole text, so it cannot be used:
its "held-out" part would be text it saw.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import time
from importlib import import_module
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from export.bench.machine import cpu_name  # noqa: E402
from export.cpu import cpu_flags  # noqa: E402
from export.opening import open_export, open_model  # noqa: E402
from runtime.files.atomic import atomic_write_bytes  # noqa: E402
from runtime.files.tokenizer import ByteTokenizer  # noqa: E402
from runtime.generate import open_session  # noqa: E402
from runtime.perplexity import TextScore, score_text, top1_agreement  # noqa: E402
from runtime.sampling import Sampling, decode  # noqa: E402
from runtime.sessions import Runtime  # noqa: E402
from zoo.files.weights import load_built  # noqa: E402
from zoo.training.data import SHIPPED_TEXT  # noqa: E402

EXPORTS = {"fp32": [], "int8": ["--quantize", "int8"], "int4": ["--quantize", "int4"]}
HELD_OUT = 0.1  # the text's last tenth, cut at the next blank line (a speech boundary)
PROMPT, NEW_TOKENS = 32, 64
PACKAGES = ("torch", "onnx", "onnxruntime", "numpy")  # modules: onnxruntime-gpu is one


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def split_text(work: Path) -> tuple[Path, Path]:
    raw = SHIPPED_TEXT.read_bytes()
    cut = raw.index(b"\n\n", int(len(raw) * (1 - HELD_OUT))) + 2
    train, held = work / "train.txt", work / "heldout.txt"
    atomic_write_bytes(train, raw[:cut])
    atomic_write_bytes(held, raw[cut:])
    return train, held


def zoo(*args: str) -> None:
    """One `zoo` command, as a user types it (its progress goes to our stderr)."""
    log("zoo " + " ".join(args))
    command = [sys.executable, "-c", "import sys, cli; sys.exit(cli.main())", *args]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    if subprocess.run(command, cwd=ROOT, env=env, check=False).returncode:
        raise SystemExit(f"failed: zoo {' '.join(args)}")


def make_models(work: Path, train: Path, steps: int) -> dict[str, Path]:
    built, trained = work / "gpt-tiny", work / "trained"
    zoo("build", "gpt-tiny", "-o", str(built), "--seed", "0", "--force")
    zoo("train", str(built), "--task", "lm", "--data", str(train), "--steps", str(steps),
        "--lr", "3e-3", "-o", str(trained), "--force")
    folders = {"built": built, "trained": trained}
    for name, extra in EXPORTS.items():
        folders[name] = work / name
        zoo("export", str(trained), "--onnx", "--optimize", *extra, "-o", str(folders[name]),
            "--force")
    return folders


def onnx_bytes(folder: Path) -> dict[str, int]:
    """The external weights file (shared by the graphs) and the graphs themselves (the
    --optimize export has three: model, model_kv, model_genai)."""
    files = [p for p in folder.rglob("*") if p.is_file()]  # the graphs are under onnx/
    return {"weights_bytes": sum(p.stat().st_size for p in files if p.name.endswith(".data")),
            "graph_bytes": sum(p.stat().st_size for p in files if p.name.endswith(".onnx"))}


def greedy_rates(runtimes: dict[str, Runtime], prompt: np.ndarray, rounds: int
                 ) -> tuple[dict[str, float], dict[str, np.ndarray]]:
    """Median tokens/s of greedy decoding, engines interleaved (one run each per round) so the
    shared machine's drifting load weighs on all alike; and each one's tokens."""
    mask = np.ones_like(prompt)

    def run(runtime: Runtime) -> np.ndarray:
        session = open_session(runtime, PROMPT + NEW_TOKENS, shared_cache=True)
        return decode(session, prompt, mask, NEW_TOKENS, Sampling(), None)

    tokens = {name: run(runtime)[0] for name, runtime in runtimes.items()}  # also warms up
    times: dict[str, list[float]] = {name: [] for name in runtimes}
    for _ in range(rounds):
        for name, runtime in runtimes.items():
            start = time.perf_counter()
            run(runtime)
            times[name].append(time.perf_counter() - start)
    return {name: NEW_TOKENS / statistics.median(t) for name, t in times.items()}, tokens


def measure(folders: dict[str, Path], held: Path, rounds: int) -> dict:
    tokenizer = ByteTokenizer()
    ids = tokenizer.encode(held.read_text(encoding="utf-8"))
    scores: dict[str, TextScore] = {}
    for name in ("built", "trained"):
        log(f"perplexity: {name} model (PyTorch)")
        scores[f"torch {name}"] = score_text(open_model(*load_built(folders[name])), ids)
    runtimes = {name: open_export(folders[name]) for name in EXPORTS}
    for name, runtime in runtimes.items():
        log(f"perplexity: {name} export (ONNX Runtime)")
        scores[name] = score_text(runtime, ids)
    log(f"greedy decoding: {rounds} interleaved rounds")
    prompt = np.array([ids[:PROMPT]], np.int64)
    rates, tokens = greedy_rates(runtimes, prompt, rounds)
    rows = {}
    for name, score in scores.items():
        row = {"perplexity": score.perplexity, "nats_per_token": score.nats_per_token,
               "predictions": score.predictions,
               "top1_agreement_with_fp32": top1_agreement(scores["fp32"], score)}
        if name in EXPORTS:
            same = tokens[name] == tokens["fp32"]
            row |= {"greedy_tokens_per_s": rates[name], **onnx_bytes(folders[name]),
                    "greedy_same_as_fp32": int(same.sum()),
                    "greedy_first_divergence": int(np.argmin(same)) if not same.all() else None,
                    "greedy_text": tokenizer.decode(tokens[name].tolist())}
        rows[name] = row
    return {"held_out_tokens": len(ids), "prompt": tokenizer.decode(prompt[0].tolist()),
            "rows": rows}


def machine() -> dict:
    return {"cpu": cpu_name(), "cpu_flags": cpu_flags(),
            "cores": os.cpu_count(), "omp_num_threads": os.environ.get("OMP_NUM_THREADS"),
            "python": platform.python_version(),
            "versions": {name: import_module(name).__version__ for name in PACKAGES}}


def _divergence(row: dict) -> str:
    first = row["greedy_first_divergence"]
    return f"all {NEW_TOKENS} the same" if first is None else f"differ from token {first}"


def table(result: dict) -> str:
    lines = ["| | perplexity | nats/token | top-1 agreement with fp32 | greedy tok/s | "
             "weights file (graphs) | greedy tokens against fp32's |",
             "| --- | --- | --- | --- | --- | --- | --- |"]
    for name, row in result["rows"].items():
        extra = (f"{row['greedy_tokens_per_s']:.0f} | {row['weights_bytes'] / 1e3:.1f} kB "
                 f"({row['graph_bytes'] / 1e3:.0f} kB) | "
                 f"{_divergence(row)}" if "weights_bytes" in row
                 else " | | ")
        lines.append(f"| {name} | {row['perplexity']:.3f} | {row['nats_per_token']:.4f} | "
                     f"{row['top1_agreement_with_fp32']:.2%} | {extra} |")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--work", type=Path, required=True, help="folder for models, exports")
    parser.add_argument("--json", type=Path, help="write every figure here")
    parser.add_argument("--steps", type=int, default=800, help="training steps (demo: 800)")
    parser.add_argument("--rounds", type=int, default=20, help="greedy timing rounds")
    parser.add_argument("--reuse", action="store_true",
                        help="measure the models already in --work (skip training, exporting)")
    parser.add_argument("--force", action="store_true", help="overwrite --work and --json")
    args = parser.parse_args()
    if args.json and args.json.exists() and not args.force:
        print(f"error: {args.json} exists; use --force to overwrite", file=sys.stderr)
        return 2
    if args.reuse:
        folders = {"built": args.work / "gpt-tiny", "trained": args.work / "trained",
                   **{name: args.work / name for name in EXPORTS}}
        held = args.work / "heldout.txt"
        missing = [str(path) for path in [*folders.values(), held] if not path.exists()]
        if missing:
            print(f"error: --reuse: missing {', '.join(missing)}", file=sys.stderr)
            return 2
    else:
        if args.work.exists() and not args.force:
            print(f"error: {args.work} exists; use --force (or --reuse)", file=sys.stderr)
            return 2
        shutil.rmtree(args.work, ignore_errors=True)
        args.work.mkdir(parents=True)
        train, held = split_text(args.work)
        folders = make_models(args.work, train, args.steps)
    load_before = os.getloadavg()
    result = {"machine": machine(), "steps": args.steps, "load_before": load_before,
              **measure(folders, held, args.rounds), "load_after": os.getloadavg()}
    print(json.dumps(result["machine"]))
    print(f"load average before/after: {load_before} / {result['load_after']}")
    print(f"held-out: {result['held_out_tokens']} tokens; greedy prompt {result['prompt']!r}")
    print(table(result))
    for name in EXPORTS:
        print(f"{name} greedy: {result['rows'][name]['greedy_text']!r}")
    if args.json:
        atomic_write_bytes(args.json, json.dumps(result, indent=1).encode())
    return 0


if __name__ == "__main__":
    sys.exit(main())
