"""ONNX Runtime GenAI's own generation loop against the zoo's generate() on the same export:
greedy tokens per second, measured side by side (interleaved, medians), with the CPU flags.

    python -m export.bench.genai_vs_zoo gpt-tiny gpt2-small --tokens 64 --repeats 7

A NAME is built with --seed and exported to a temporary folder (--optimize, so GenAI runs the
shared-cache graph and the zoo its shared-cache loop); an existing export folder is used as it
is. Both loops decode the same prompt to the same length; the tokens are checked equal first.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from importlib.metadata import version
from pathlib import Path

import numpy as np

from export.bench.machine import cpu_name, load_average
from export.cpu import cpu_flags
from export.opening import open_export
from export.options import ExportOptions
from export.pipeline import export_and_verify
from runtime.generate import generate
from zoo.files.sources import load_source


def genai_runner(folder: Path, prompt: list[int], new_tokens: int):  # noqa: ANN201
    import onnxruntime_genai as og

    model = og.Model(str(folder))

    def run() -> list[int]:
        params = og.GeneratorParams(model)
        params.set_search_options(max_length=len(prompt) + new_tokens, do_sample=False,
                                  min_length=len(prompt) + new_tokens)  # no early eos
        generator = og.Generator(model, params)
        generator.append_tokens(np.array([prompt], np.int32))
        while not generator.is_done():
            generator.generate_next_token()
        return generator.get_sequence(0)[len(prompt):].tolist()

    return run


def zoo_runner(folder: Path, prompt: list[int], new_tokens: int):  # noqa: ANN201
    runtime = open_export(folder)
    ids = np.array([prompt], np.int64)
    return lambda: generate(runtime, ids, None, new_tokens).tolist()[0]  # no eos: full length


def measure(folder: Path, prompt_length: int, new_tokens: int, repeats: int) -> dict[str, float]:
    card = json.loads((folder / "manifest.json").read_text())["card"]
    prompt = [int(i) for i in np.random.default_rng(0).integers(3, card["vocab_size"] - 8,
                                                                 prompt_length)]
    runners = {"genai": genai_runner(folder, prompt, new_tokens),
               "zoo": zoo_runner(folder, prompt, new_tokens)}
    tokens = {name: run() for name, run in runners.items()}  # also the warm-up
    if tokens["genai"] != tokens["zoo"]:
        raise SystemExit(f"{folder}: GenAI and the zoo picked different tokens")
    times: dict[str, list[float]] = {name: [] for name in runners}
    for _ in range(repeats):  # interleaved, so a slow moment hits both
        for name, run in runners.items():
            start = time.perf_counter()
            run()
            times[name].append(time.perf_counter() - start)
    return {name: new_tokens / statistics.median(values) for name, values in times.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("sources", nargs="+", metavar="NAME|OUT")
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--prompt", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    print(f"cpu: {cpu_name()}; flags: {' '.join(cpu_flags()) or '-'}; "
          f"load average before: {load_average()[0]:.2f}")
    print("versions: " + ", ".join(f"{p} {version(p)}" for p in
                                   ("onnxruntime-genai-cuda", "onnxruntime-gpu", "torch")
                                   if _installed(p)))
    print(f"greedy, batch 1, prompt {args.prompt}, {args.tokens} new tokens, median of "
          f"{args.repeats}")
    with tempfile.TemporaryDirectory() as scratch:
        for source in args.sources:
            folder = Path(source)
            if not (folder / "manifest.json").is_file():
                model, card = load_source(source, seed=args.seed)
                folder = Path(scratch) / card.name
                export_and_verify(model, card, folder, ExportOptions(optimize=True))
            rates = measure(folder, args.prompt, args.tokens, args.repeats)
            print(f"{source}: GenAI {rates['genai']:.0f} tokens/s, zoo generate "
                  f"{rates['zoo']:.0f} tokens/s ({rates['genai'] / rates['zoo']:.2f}x)")


def _installed(package: str) -> bool:
    try:
        version(package)
    except Exception:  # PackageNotFoundError
        return False
    return True


if __name__ == "__main__":
    main()
