"""One encoder-decoder step (decoder.onnx, past 16, batch 1) at source 16 and 512, before and
after a change, in one run (issue #26 item 3: the step at 512 at most 1.2x the step at 16).

    .venv/bin/python benchmarks/seq2seq_step_profile.py --threads 1 [--before REV] [--json OUT]

Both exports are `zoo export transformer-base --onnx --optimize` (the same seed, so the same
weights): "after" by this tree's code, "before" by commit REV's own code (git archive, as
tests/house/test_same_bytes.py builds old exports), made once under --work and reused (remove
--work's `transformer-base-after` after changing the code). The four cases (two exports, two
sources) are timed in the same interleaved rounds, one run of each per round, so the shared
machine's drifting load weighs on all alike (timing one source after the other reported 0.86x
and 1.69x for the same graph within a minute, load ~4.6); the ratios are the result. Then ONNX
Runtime's profiler, the exports' runs interleaved again: per operator type what grows with the
source, each node's fastest run summed (which a preempted thread does not inflate), and the
rate at which the step reads the longer cross cache against the rate it reads its weights.
`--threads 1` on a shared 2-core machine: with two threads other jobs' load made every figure
noise (BENCHMARKS.md).
"""

from __future__ import annotations

import argparse
import bisect
import collections
import io
import json
import os
import subprocess
import sys
import tarfile
import tempfile
from importlib.metadata import version
from pathlib import Path

import numpy as np
import onnxruntime as ort

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(HERE))

from export.bench.machine import cpu_name  # noqa: E402
from export.bench.timing import measure_interleaved  # noqa: E402
from export.cpu import cpu_flags  # noqa: E402
from runtime.sessions import DISABLED_OPTIMIZERS, PROVIDERS, session_options  # noqa: E402

CARD = "transformer-base"
SOURCES = (16, 512)
PAST = 16
BEFORE = "47f2a82e11675023bb63fea07a0106c610a03285"  # main before issue #26 item 3
TARGET = 1.2  # the bound on the step at 512 over the step at 16


def machine() -> dict:
    """peers.py's machine() without its environment's packages: this runs in .venv."""
    return {"cpu": cpu_name(), "flags": cpu_flags(), "cores": os.cpu_count(),
            "load_1min": os.getloadavg()[0],
            "versions": {name: version(name) for name in ("onnxruntime-gpu", "onnx", "torch")}}


def export(tree: Path, out: Path) -> Path:
    """`zoo export CARD --onnx --optimize -o OUT`, by `tree`'s own code; reused when there."""
    if (out / "decoder.onnx").is_file():
        return out
    command = [sys.executable, "-c", "import sys, cli; sys.exit(cli.main())", "export", CARD,
               "--onnx", "--optimize", "-o", str(out), "--force"]
    print(f"exporting {CARD} with {tree} ...", file=sys.stderr, flush=True)
    subprocess.run(command, cwd=tree, check=True, env={**os.environ, "PYTHONPATH": str(tree)},
                   stdout=subprocess.DEVNULL)
    return out


def export_at(commit: str, out: Path) -> Path:
    if (out / "decoder.onnx").is_file():
        return out
    archive = subprocess.run(["git", "archive", commit], cwd=ROOT, capture_output=True,
                             check=True)
    with tempfile.TemporaryDirectory() as tree:
        with tarfile.open(fileobj=io.BytesIO(archive.stdout)) as tar:
            tar.extractall(tree, filter="data")
        return export(Path(tree), out)


def size(axis: object, source: int) -> int:
    if isinstance(axis, int):
        return axis
    return source if "encoder" in str(axis) else PAST if "past" in str(axis) else 1


def step_feeds(session: ort.InferenceSession, source: int) -> dict[str, np.ndarray]:
    """One step: token 3, masks of ones, random caches (past PAST, the source's length)."""
    rng = np.random.default_rng(0)
    feeds = {}
    for graph_input in session.get_inputs():
        shape = [size(axis, source) for axis in graph_input.shape]
        if graph_input.type == "tensor(int64)":
            feeds[graph_input.name] = np.full(shape, 3 if graph_input.name == "input_ids" else 1,
                                              np.int64)
        else:
            feeds[graph_input.name] = rng.standard_normal(shape).astype(np.float32)
    return feeds


def session(folder: Path, threads: int | None, profile: str | None = None
            ) -> ort.InferenceSession:
    """The zoo's own session (runtime/sessions.py), optionally profiling."""
    return ort.InferenceSession(str(folder / "decoder.onnx"), session_options(threads, profile),
                                providers=[PROVIDERS["cpu"]],
                                disabled_optimizers=DISABLED_OPTIMIZERS)


def cross_bytes(graph: ort.InferenceSession, source: int) -> int:
    """Bytes of the cross cache one step reads at `source`."""
    return sum(4 * int(np.prod([size(axis, source) for axis in i.shape]))
               for i in graph.get_inputs() if ".encoder." in i.name)


def weight_bytes(folder: Path) -> int:
    import onnx

    graph = onnx.load(str(folder / "decoder.onnx"), load_external_data=False).graph
    return sum(4 * int(np.prod(t.dims)) for t in graph.initializer if len(t.dims) == 2)


def timed(folders: dict[str, Path], threads: int | None, rounds: int) -> dict[str, dict]:
    runs = {}
    for label, folder in folders.items():
        graph = session(folder, threads)
        for source in SOURCES:
            feeds = step_feeds(graph, source)
            runs[f"{label} source {source}"] = (lambda g=graph, f=feeds: g.run(None, f))
    return {name: timing.as_dict() for name, timing in measure_interleaved(runs, rounds).items()}


def growth(folders: dict[str, Path], threads: int | None, rounds: int
           ) -> dict[str, dict[str, dict[str, float]]]:
    """{export: {operator type: {source: ms}}}, each node's fastest run summed per type; the
    exports' runs interleaved too, so that they are profiled under the same load."""
    with tempfile.TemporaryDirectory() as work:
        graphs = {label: session(folder, threads, os.path.join(work, label))
                  for label, folder in folders.items()}
        feeds = {label: {source: step_feeds(graph, source) for source in SOURCES}
                 for label, graph in graphs.items()}
        for _ in range(rounds):
            for label, graph in graphs.items():
                for source in SOURCES:
                    graph.run(None, feeds[label][source])
        profiles = {}
        for label, graph in graphs.items():
            with open(graph.end_profiling(), encoding="utf-8") as stream:
                profiles[label] = json.load(stream)
    return {label: _by_kind(events) for label, events in profiles.items()}


def _by_kind(events: list[dict]) -> dict[str, dict[str, float]]:
    """One session's profile, its runs alternating SOURCES: {op type: {source: ms}}."""
    starts = [e["ts"] for e in events if e.get("cat") == "Session" and e["name"] == "model_run"]
    fastest: dict[int, dict[str, float]] = {source: {} for source in SOURCES}
    kinds = {}
    for event in events:
        if event.get("cat") == "Node" and event["name"].endswith("_kernel_time"):
            run = bisect.bisect_right(starts, event["ts"]) - 1
            if run < 2 * len(SOURCES):  # two warm-up rounds
                continue
            node, source = event["name"], SOURCES[run % len(SOURCES)]
            kinds[node] = event["args"]["op_name"]
            fastest[source][node] = min(fastest[source].get(node, float("inf")), event["dur"])
    by_kind: dict[str, dict[str, float]] = collections.defaultdict(lambda: dict.fromkeys(
        map(str, SOURCES), 0.0))
    for source, nodes in fastest.items():
        for node, microseconds in nodes.items():
            by_kind[kinds[node]][str(source)] += microseconds / 1000
    return dict(by_kind)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", default=BEFORE, help="the commit whose export is 'before'")
    parser.add_argument("--work", type=Path, default=HERE / "work")
    parser.add_argument("--threads", type=int, help="intra-op threads (default: ORT's)")
    parser.add_argument("--rounds", type=int, default=60)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    args.work.mkdir(parents=True, exist_ok=True)
    folders = {"before": export_at(args.before, args.work / f"{CARD}-{args.before[:8]}"),
               "after": export(ROOT, args.work / f"{CARD}-after")}
    report = {"before": machine(), "rows": []}
    print(json.dumps(report["before"]), flush=True)
    times = timed(folders, args.threads, args.rounds)
    profiles = growth(folders, args.threads, max(10, args.rounds // 3))
    low, high = SOURCES
    for label in folders:
        a, b = times[f"{label} source {low}"], times[f"{label} source {high}"]
        ops = profiles[label]
        grew = sorted(ops, key=lambda op: ops[op][str(low)] - ops[op][str(high)])[:5]
        nodes = {str(s): sum(o[str(s)] for o in ops.values()) for s in SOURCES}
        graph = session(folders[label], args.threads)
        extra = cross_bytes(graph, high) - cross_bytes(graph, low)
        report["rows"].append({
            "graph": label, "step_ms": {str(low): a, str(high): b},
            "ratio_median": b["median_ms"] / a["median_ms"], "ratio_min": b["min_ms"] / a["min_ms"],
            "target": TARGET, "grew_ms": {op: ops[op] for op in grew}, "node_sum_ms": nodes,
            # what remains: reading the longer cross cache, against the step's weight reads
            "cross_cache_extra_mb": extra / 1e6,
            "cross_read_gb_s": extra / 1e6 / (nodes[str(high)] - nodes[str(low)]),
            "weights_read_gb_s": weight_bytes(folders[label]) / 1e6 / nodes[str(low)]})
    report["after"] = machine()
    for row in report["rows"]:
        print(json.dumps(row), flush=True)
    print(json.dumps({"load_1min_after": report["after"]["load_1min"]}))
    if args.json:
        args.json.write_text(json.dumps(report, indent=1), encoding="utf-8")
    for row in report["rows"]:
        steps = row["step_ms"]
        print(f"{row['graph']:<7} step at source {low}: {steps[str(low)]['median_ms']:.2f} ms "
              f"(min {steps[str(low)]['min_ms']:.2f}), at {high}: "
              f"{steps[str(high)]['median_ms']:.2f} ms (min {steps[str(high)]['min_ms']:.2f}): "
              f"{row['ratio_median']:.2f}x median, {row['ratio_min']:.2f}x min "
              f"(target <= {TARGET}x)")
        nodes = row["node_sum_ms"]
        print(f"        each node's fastest run, summed: {nodes[str(low)]:.2f} -> "
              f"{nodes[str(high)]:.2f} ms ({nodes[str(high)] / nodes[str(low)]:.2f}x); the "
              f"{row['cross_cache_extra_mb']:.1f} MB more cross cache read at "
              f"{row['cross_read_gb_s']:.1f} GB/s, the weights at "
              f"{row['weights_read_gb_s']:.1f} GB/s")
        for op, ms in row["grew_ms"].items():
            print(f"        {op:<22} {ms[str(low)]:7.3f} -> {ms[str(high)]:7.3f} ms")


if __name__ == "__main__":
    main()
