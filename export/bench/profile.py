"""Where ONNX Runtime spends its time: per-operator totals from its profiler.

Used by `zoo bench --profile`; the profiler writes a Chrome-trace JSON, from which we sum the
kernel times of each operator type per run.
"""

from __future__ import annotations

import json
import tempfile
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path

from runtime.sessions import Graph, session_options


def profiled_graph(path: Path, provider: str, threads: int | None, folder: Path) -> Graph:
    return Graph(path, provider, threads, session_options(threads, str(folder / "ort")))


def op_times(graph: Graph, run: Callable[[], object], runs: int = 5) -> dict[str, float]:
    """Milliseconds per run spent in each operator type, largest first (after one warm-up)."""
    run()
    for _ in range(runs):
        run()
    trace = Path(graph.session.end_profiling())
    events = json.loads(trace.read_text(encoding="utf-8"))
    trace.unlink(missing_ok=True)
    totals: dict[str, float] = defaultdict(float)
    for event in events:
        if event.get("cat") != "Node" or not event.get("name", "").endswith("_kernel_time"):
            continue
        totals[event["args"].get("op_name", "?")] += event["dur"] / 1e3  # microseconds -> ms
    # The warm-up run is in the trace too; it is one of runs + 1.
    return {op: ms / (runs + 1) for op, ms in sorted(totals.items(), key=lambda kv: -kv[1])}


def temporary_folder() -> tempfile.TemporaryDirectory:
    return tempfile.TemporaryDirectory(prefix="zoo-profile-")
