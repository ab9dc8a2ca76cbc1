"""One decoder.onnx step at source 16 and 512 under ONNX Runtime's profiler: the step's time,
and per operator type what grows with the source (issue #26 item 3).

    .venv/bin/zoo export transformer-base --onnx --optimize -o DIR
    .venv/bin/python benchmarks/seq2seq_step_profile.py DIR
"""

from __future__ import annotations

import collections
import json
import os
import sys
import tempfile
import time

import numpy as np
import onnxruntime as ort

SOURCES = (16, 512)
PAST = 16


def size(axis: object, source: int) -> int:
    if isinstance(axis, int):
        return axis
    text = str(axis)
    return source if "encoder" in text else PAST if "past" in text else 1


def step_feeds(session: ort.InferenceSession, source: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    feeds = {}
    for graph_input in session.get_inputs():
        shape = [size(axis, source) for axis in graph_input.shape]
        if graph_input.type == "tensor(int64)":  # input_ids (token 3) and the masks (ones)
            feeds[graph_input.name] = np.full(shape, 3 if graph_input.name == "input_ids" else 1,
                                              np.int64)
        else:
            feeds[graph_input.name] = rng.standard_normal(shape).astype(np.float32)
    return feeds


def main() -> None:
    folder = sys.argv[1]
    options = ort.SessionOptions()
    options.enable_profiling = True
    options.profile_file_prefix = os.path.join(tempfile.gettempdir(), "step-profile")
    session = ort.InferenceSession(f"{folder}/decoder.onnx", options,
                                   providers=["CPUExecutionProvider"])
    medians = {}
    for source in SOURCES:
        feeds = step_feeds(session, source)
        for _ in range(5):
            session.run(None, feeds)
        times = []
        for _ in range(30):
            start = time.perf_counter()
            session.run(None, feeds)
            times.append(time.perf_counter() - start)
        medians[source] = float(np.median(times)) * 1000
    profile = session.end_profiling()
    with open(profile, encoding="utf-8") as stream:
        events = json.load(stream)
    os.remove(profile)
    runs = [e for e in events if e.get("cat") == "Session" and e["name"] == "model_run"]
    cut = runs[len(runs) // 2]["ts"]  # the second half of the runs are the long source's
    per_op = {source: collections.Counter() for source in SOURCES}
    for event in events:
        if event.get("cat") == "Node" and event["name"].endswith("_kernel_time"):
            per_op[SOURCES[event["ts"] >= cut]][event["args"]["op_name"]] += event["dur"]
    count = len(runs) // 2
    low, high = SOURCES
    print(f"step median: source {low} {medians[low]:.2f} ms, source {high} "
          f"{medians[high]:.2f} ms ({medians[high] / medians[low]:.2f}x)")
    for op in sorted(set(per_op[low]) | set(per_op[high]),
                     key=lambda name: per_op[low][name] - per_op[high][name])[:8]:
        print(f"{op:<24} {per_op[low][op] / count / 1000:7.3f} ms -> "
              f"{per_op[high][op] / count / 1000:7.3f} ms")


if __name__ == "__main__":
    main()
