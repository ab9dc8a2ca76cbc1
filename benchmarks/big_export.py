"""An export past protobuf's 2 GB (issue #49): gemma-3-1b with random weights (1.0B parameters,
4.0 GB in float32, a 262k vocabulary, local layers), built and exported as a user does:

    PYTHONPATH=. .venv/bin/python benchmarks/big_export.py --work out/big --json big.json

Per command (`zoo build`, `zoo export --onnx`, its check included): the wall time and the peak
resident memory, and the export's peak over the weights' bytes (issue #49's goal: at most
2.5x); the files it wrote (the graph, its external data, the reference weights); how long ONNX
Runtime takes to open the graph and to run one 16-token prompt, and its resident memory then.
The CPU and its flags are printed.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.commands import log, zoo  # noqa: E402
from export.bench.machine import cpu_name  # noqa: E402
from export.cpu import cpu_flags  # noqa: E402
from runtime.files.atomic import atomic_write_bytes  # noqa: E402
from runtime.files.tokenizer import BYTE_TOKENIZER, ByteTokenizer  # noqa: E402

CARD = "gemma-3-1b"


def resident_gib() -> float:
    for line in Path("/proc/self/status").read_text(encoding="utf-8").splitlines():
        if line.startswith("VmRSS"):
            return int(line.split()[1]) / 2**20
    return float("nan")


def onnx_runtime_figures(export: Path) -> dict[str, float]:
    """Opening the export with `zoo.load`'s runtime and one prompt through its graph."""
    from export.opening import open_export
    from runtime.contract import CACHE_INPUT, MODEL_GRAPH, past_names
    from runtime.decoding import empty_past

    started = time.perf_counter()
    runtime = open_export(export)
    opened = time.perf_counter() - started
    ids = np.arange(3, 19, dtype=np.int64)[None]
    past = dict(zip(past_names(runtime.card["n_layers"], CACHE_INPUT), empty_past(runtime, 1),
                    strict=True))
    started = time.perf_counter()
    runtime.run(MODEL_GRAPH, {"input_ids": ids, "attention_mask": np.ones_like(ids),
                              "position_ids": np.arange(16)[None], **past})
    return {"open_seconds": opened, "prompt16_seconds": time.perf_counter() - started,
            "resident_gib": resident_gib(),
            "peak_gib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--work", type=Path, default=Path("out/big-export"))
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    shutil.rmtree(args.work, ignore_errors=True)
    args.work.mkdir(parents=True)
    built, export = args.work / "built", args.work / "export"
    result = {"cpu": cpu_name(), "cpu_flags": cpu_flags(), "cores": os.cpu_count(),
              "card": CARD}
    log(f"{result['cpu']} ({result['cores']} cores): {' '.join(result['cpu_flags'])}")
    result["build"] = zoo("build", CARD, "-o", str(built), "--seed", "0")
    (built / BYTE_TOKENIZER).write_text(ByteTokenizer().to_json(), encoding="utf-8")
    weights = (built / "model.safetensors").stat().st_size
    result["export"] = zoo("export", str(built), "--onnx", "-o", str(export))
    result["weights_gib"] = weights / 2**30
    result["export"]["peak_over_weights"] = result["export"]["peak_rss_gib"] * 2**30 / weights
    result["files_gib"] = {str(path.relative_to(export)): path.stat().st_size / 2**30
                           for path in sorted(export.rglob("*")) if path.stat().st_size > 2**20}
    result["onnx_runtime"] = onnx_runtime_figures(export)
    text = json.dumps(result, indent=2)
    print(text)
    if args.json:
        atomic_write_bytes(args.json, (text + "\n").encode())
    return 0


if __name__ == "__main__":
    sys.exit(main())
