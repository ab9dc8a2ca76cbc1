"""int8-dynamic's graph rewrites (export/onnx/smoothing.py) on a small graph made here: a
LayerNormalization with one outlier channel feeding a MatMul, then ReLU and a d_ff x d_model
MatMul. The expected values are numpy's: the rewrites change nothing in fp32, the smoothing
scales follow SmoothQuant's formula, and ONNX Runtime's int8 gets closer to fp32 with them."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper
from onnxruntime.quantization import QuantType, quantize_dynamic

import export.onnx.smoothing
from export.onnx.dynamic import DynamicSettings, quantize_dynamic_graph
from export.onnx.smoothing import ALPHAS, prepare_for_int8

D, FF, EPS = 16, 32, 1e-5
RNG = np.random.default_rng(7)
GAMMA = np.ones(D, np.float32)
GAMMA[3] = 40.0  # the outlier channel, as BERT's LayerNorm outputs have a few
BETA = RNG.normal(0, 0.1, D).astype(np.float32)
W1 = RNG.normal(0, 0.3, (D, FF)).astype(np.float32)
B1 = RNG.normal(0, 0.1, FF).astype(np.float32)
W2 = RNG.normal(0, 0.3, (FF, D)).astype(np.float32)


def graph() -> onnx.ModelProto:
    tensors = [numpy_helper.from_array(a, n) for a, n in
               ((GAMMA, "gamma"), (BETA, "beta"), (W1, "w1"), (B1, "b1"), (W2, "w2"))]
    nodes = [helper.make_node("LayerNormalization", ["x", "gamma", "beta"], ["h"], axis=-1,
                              epsilon=EPS, name="norm"),
             helper.make_node("MatMul", ["h", "w1"], ["a"], name="up"),
             helper.make_node("Add", ["a", "b1"], ["a1"], name="bias"),
             helper.make_node("Relu", ["a1"], ["r"], name="relu"),
             helper.make_node("MatMul", ["r", "w2"], ["y"], name="down")]
    body = helper.make_graph(nodes, "ffn", [helper.make_tensor_value_info(
        "x", TensorProto.FLOAT, ["b", "t", D])], [helper.make_tensor_value_info(
            "y", TensorProto.FLOAT, ["b", "t", D])], tensors)
    return helper.make_model(body, opset_imports=[helper.make_opsetid("", 18)], ir_version=9)


def numpy_ffn(x: np.ndarray) -> np.ndarray:
    x = x.astype(np.float64)
    h = (x - x.mean(-1, keepdims=True)) / np.sqrt(x.var(-1, keepdims=True) + EPS) * GAMMA + BETA
    return np.maximum(h @ W1 + B1, 0) @ W2


def inputs(seed: int) -> np.ndarray:
    return np.random.default_rng(seed).normal(0, 1, (4, 12, D)).astype(np.float32)


def run(model: onnx.ModelProto | str, x: np.ndarray) -> np.ndarray:
    source = model if isinstance(model, str) else model.SerializeToString()
    session = ort.InferenceSession(source, providers=["CPUExecutionProvider"])
    return session.run(["y"], {"x": x})[0]


def rewritten() -> tuple[onnx.ModelProto, object]:
    model = graph()
    report = prepare_for_int8(model, {"x": inputs(1)}, D, FF)
    return model, report


def test_the_rewrites_change_nothing_in_fp32() -> None:
    model, report = rewritten()
    ops = [node.op_type for node in model.graph.node]
    assert set(report.smoothed) == {"up"} and report.smoothed["up"] in ALPHAS  # smoothed: up
    assert report.per_token == ["down"] and ops.count("Mul") == 3 and "ReduceMax" in ops
    x = inputs(2)
    np.testing.assert_allclose(run(graph(), x), numpy_ffn(x), rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(run(model, x), numpy_ffn(x), rtol=1e-4, atol=1e-4)


def test_the_smoothing_scales_follow_smoothquant(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(export.onnx.smoothing, "ALPHAS", (0.8,))  # 0.5 would hide a swap
    model, report = rewritten()
    alpha = report.smoothed["up"]
    assert alpha == 0.8
    x = inputs(1).reshape(-1, D).astype(np.float64)
    h = (x - x.mean(-1, keepdims=True)) / np.sqrt(x.var(-1, keepdims=True) + EPS) * GAMMA + BETA
    expected = np.abs(h).max(0) ** alpha / np.abs(W1).max(1) ** (1 - alpha)
    stored = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    inverse = next(value for name, value in stored.items() if name.endswith("_inverse"))
    np.testing.assert_allclose(1 / inverse, expected, rtol=1e-4)
    np.testing.assert_allclose(stored["w1"], W1 * expected[:, None].astype(np.float32),
                               rtol=1e-4)
    assert np.argmax(expected) == 3  # the outlier channel is divided the most


def test_int8_gets_closer_to_fp32_with_the_rewrites(tmp_path: Path) -> None:
    plain = tmp_path / "plain.onnx"
    onnx.save(graph(), str(tmp_path / "fp32.onnx"))
    quantize_dynamic(str(tmp_path / "fp32.onnx"), str(plain), op_types_to_quantize=["MatMul"],
                     per_channel=True, weight_type=QuantType.QInt8)
    smoothed, count, _ = quantize_dynamic_graph(graph(), DynamicSettings(True, False), D, FF,
                                                {"x": inputs(1)})
    assert count == 2
    x = inputs(3)
    exact = numpy_ffn(x)

    def worst_row_error(found: np.ndarray) -> float:  # the quietest tokens suffer most
        error = np.linalg.norm(found - exact, axis=-1) / np.linalg.norm(exact, axis=-1)
        return float(error.max())

    before, after = worst_row_error(run(str(plain), x)), worst_row_error(run(smoothed, x))
    assert after < 0.5 * before, (before, after)  # measured: 0.19 -> 0.07


def test_calibration_runs_in_chunks_and_sees_every_row(monkeypatch: pytest.MonkeyPatch) -> None:
    """One sequence at a time, as the whole batch: each channel's largest |h|, the least h."""
    monkeypatch.setattr(export.onnx.smoothing, "CHUNK_ROWS", 1)
    x = inputs(4)
    seen = export.onnx.smoothing.observed(graph(), ["h"], {"x": x})["h"]
    flat = x.reshape(-1, D).astype(np.float64)
    h = (flat - flat.mean(-1, keepdims=True)) / np.sqrt(flat.var(-1, keepdims=True) + EPS)
    h = h * GAMMA + BETA
    np.testing.assert_allclose(seen.channel_max, np.abs(h).max(0), rtol=1e-4)
    assert seen.least == pytest.approx(h.min(), rel=1e-4)
    assert seen.rows.shape == (len(flat), D)  # 48 rows: all kept (SAMPLE_TOKENS is 1024)
