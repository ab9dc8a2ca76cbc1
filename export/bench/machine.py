"""The machine's limits, measured in the same run as the benchmark they scale.

Compute: one large fp32 matrix product, through ONNX Runtime (a one-node MatMul graph, run by
the same library and thread pool as the models) and through torch. Memory: a read of a 1 GiB
array, by numpy (one thread) and by torch (its thread pool); the faster is the bound, since a
decoding step is a read of every weight by all threads.
"""

from __future__ import annotations

import os

import numpy as np
import onnx
import onnxruntime as ort
import torch

from export.bench.timing import measure
from runtime.sessions import PROVIDERS, session_options

MATMUL_SIZE = 2048  # 2 * 2048^3 = 17 GFLOP: ~0.1 s on two cores, far beyond cache sizes
READ_BYTES = 1 << 30


def one_node_model(op: str, inputs: dict[str, list[int]], outputs: dict[str, list[int]]
                   ) -> onnx.ModelProto:
    """A graph of one fp32 operator, for probes of the provider and of the machine."""
    from onnx import TensorProto, helper

    graph = helper.make_graph(
        [helper.make_node(op, list(inputs), list(outputs))], op.lower(),
        [helper.make_tensor_value_info(name, TensorProto.FLOAT, shape)
         for name, shape in inputs.items()],
        [helper.make_tensor_value_info(name, TensorProto.FLOAT, shape)
         for name, shape in outputs.items()],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    model.ir_version = 10  # what ONNX Runtime 1.2x reads; onnx may default to a newer IR
    return model


def _matmul_session(rows: int, inner: int, columns: int, provider: str, threads: int | None
                    ) -> ort.InferenceSession:
    model = one_node_model("MatMul", {"a": [rows, inner], "b": [inner, columns]},
                           {"c": [rows, columns]})
    return ort.InferenceSession(model.SerializeToString(), session_options(threads),
                                providers=[PROVIDERS[provider]])


def matmul_flops(provider: str = "cpu", threads: int | None = None, size: int = MATMUL_SIZE,
                 repeats: int = 5) -> dict[str, float]:
    """Achieved FLOP/s of one size x size fp32 product: ONNX Runtime and torch."""
    rng = np.random.default_rng(0)
    a = rng.standard_normal((size, size), np.float32)
    b = rng.standard_normal((size, size), np.float32)
    flops = 2.0 * size**3
    session = _matmul_session(size, size, size, provider, threads)
    ort_time = measure(lambda: session.run(None, {"a": a, "b": b}), repeats, warmup=1)
    device = "cuda" if provider == "cuda" else "cpu"
    ta, tb = torch.from_numpy(a).to(device), torch.from_numpy(b).to(device)
    sync = torch.cuda.synchronize if device == "cuda" else None
    torch_time = measure(lambda: ta @ tb, repeats, warmup=1, sync=sync)
    return {"size": float(size), "flops": flops,
            "ort_flops_per_s": flops / ort_time.median,
            "torch_flops_per_s": flops / torch_time.median}


def read_bandwidth(provider: str = "cpu", threads: int | None = None, repeats: int = 5,
                   with_numpy: bool = True) -> dict[str, float]:
    """Bytes/s of reading a 1 GiB fp32 array: numpy's sum (one thread), torch's sum (its
    threads) and ONNX Runtime's MatMul of one row by it (its threads; what a decoding step
    does to every weight matrix). The fastest is the bound."""
    array = np.ones(READ_BYTES // 4, np.float32)
    numpy_time = measure(lambda: array.sum(), repeats, warmup=1) if with_numpy else None
    rows = 8192
    matrix = array.reshape(rows, -1)
    row = np.ones((1, rows), np.float32)
    session = _matmul_session(1, rows, matrix.shape[1], provider, threads)
    gemv_time = measure(lambda: session.run(None, {"a": row, "b": matrix}), repeats, warmup=1)
    tensor = torch.from_numpy(array)
    sync = None
    if provider == "cuda":
        tensor, sync = tensor.cuda(), torch.cuda.synchronize
    torch_time = measure(lambda: tensor.sum(), repeats, warmup=1, sync=sync)
    figures = {"bytes": float(READ_BYTES),
               "torch_bytes_per_s": READ_BYTES / torch_time.median,
               "ort_gemv_bytes_per_s": READ_BYTES / gemv_time.median}
    if numpy_time is not None:
        figures["numpy_bytes_per_s"] = READ_BYTES / numpy_time.median
    # On CUDA the torch figure is the device's; numpy's is the host's.
    figures["bound_bytes_per_s"] = (figures["torch_bytes_per_s"] if provider == "cuda" else
                                    max(value for key, value in figures.items()
                                        if key.endswith("_bytes_per_s")))
    return figures


def load_average() -> list[float]:
    try:
        return [float(x) for x in os.getloadavg()]
    except OSError:  # not on every platform
        return [float("nan")] * 3


def cpu_name() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as stream:
            for line in stream:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    import platform

    return platform.processor() or platform.machine()
