"""A Whisper decoder step against the audio's length (issue #47: the step flat in the encoder
states, the cross-attention cache read, not recomputed), in one run.

    .venv/bin/python benchmarks/whisper_step.py [--card whisper-tiny] [--threads 1]
        [--rounds 50] [--work DIR]

The card is exported once from seed (`zoo export CARD --onnx`, kept under --work). One step of
the clients' merged decoder (onnx/decoder_model_merged.onnx, batch 1, past 16) is timed at
50, 500 and 1500 encoder states (1, 10 and 30 s of audio) with the cross cache fed back
(use_cache_branch true: what every step after the first does), beside the same graph's first
branch (use_cache_branch false: it projects encoder_hidden_states to the cross keys and values,
what a decoder without the cache would do at every step). The cases run in interleaved rounds
(export/bench/timing.py), one run of each per round, so the shared machine's drifting load
weighs on all alike; the ratios are the result. Prints the machine (CPU flags, load) first.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import onnxruntime as ort

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from export.bench.machine import cpu_name  # noqa: E402
from export.bench.timing import measure_interleaved  # noqa: E402
from export.cpu import cpu_flags  # noqa: E402
from registry.catalog import open_catalog  # noqa: E402
from registry.sizes import attention_sizes  # noqa: E402
from runtime.contract import LAYOUT_DECODER, USE_CACHE_BRANCH, past_names  # noqa: E402
from runtime.sessions import session_options  # noqa: E402

STATES = (50, 500, 1500)
PAST = 16


def exported(card: str, work: Path) -> Path:
    folder = work / f"{card}-onnx"
    if not (folder / "manifest.json").is_file():
        subprocess.run([sys.executable, "-m", "cli", "export", card, "--onnx", "--out",
                        str(folder), "--force"], cwd=ROOT, check=True)
    return folder


def feeds(card: dict, states: int, cached: bool, rng: np.random.Generator) -> dict:
    sizes, n = attention_sizes(card), card["n_layers"]
    shape = (1, sizes.kv_heads, 0, sizes.head_dim)

    def cache(length: int) -> np.ndarray:
        return rng.standard_normal((*shape[:2], length, shape[3])).astype(np.float32)

    self_cache = {name: cache(PAST if cached else 0)
                  for name in past_names(n, "past_key_values", ".decoder")}
    cross = {name: cache(states if cached else 0)
             for name in past_names(n, "past_key_values", ".encoder")}
    memory = rng.standard_normal((1, states, card["d_model"])).astype(np.float32)
    return {"input_ids": np.array([[300]], np.int64), "encoder_hidden_states": memory,
            USE_CACHE_BRANCH: np.array([cached]), **self_cache, **cross}


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--card", default="whisper-tiny")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=50)
    parser.add_argument("--work", type=Path, default=Path(tempfile.gettempdir()) / "zoo-bench")
    args = parser.parse_args()
    print(f"cpu: {cpu_name()}; flags: {' '.join(cpu_flags())}; cores: {os.cpu_count()}; "
          f"load: {os.getloadavg()[0]:.1f}; onnxruntime {ort.__version__}; "
          f"threads {args.threads}")
    card = open_catalog().get(args.card).fields
    folder = exported(args.card, args.work)
    session = ort.InferenceSession(str(folder / LAYOUT_DECODER), session_options(args.threads),
                                   providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(0)
    runs = {}
    for states in STATES:
        for cached in (True, False):
            inputs = feeds(card, states, cached, rng)
            runs[(states, cached)] = (lambda inputs=inputs: session.run(["logits"], inputs))
    timings = measure_interleaved(runs, args.rounds)
    base = timings[(STATES[0], True)].median
    print(f"{'encoder states':>15} {'step, cache read':>20} {'x (50)':>7} "
          f"{'step, cache projected':>22} {'projected / read':>17}")
    for states in STATES:
        read, projected = timings[(states, True)], timings[(states, False)]
        print(f"{states:>15} {1e3 * read.median:>17.2f} ms {read.median / base:>7.2f} "
              f"{1e3 * projected.median:>19.2f} ms {projected.median / read.median:>17.2f}")
    print(f"load after: {os.getloadavg()[0]:.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
