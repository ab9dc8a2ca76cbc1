"""A GGUF tensor's own blocks as MatMulNBits: the weights ONNX Runtime computes with are, bit for
bit, those `gguf.quants.dequantize` gives (x = I at accuracy_level 0, the fp32 path), and with
int8 activations (accuracy_level 4) a random x stays within what that quantization explains."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from export.onnx.gguf_blocks import (
    MAPPED,
    gather_nodes,
    nbits_nodes,
    replace_matmuls,
    to_matmul_nbits,
)
from registry.errors import ZooError

gguf = pytest.importorskip("gguf")
N, K = 24, 512  # two 256-value K-quant blocks a row

# where each type's float16 scales sit in a block, for random blocks (gguf has no quantize)
F16_AT = {"Q4_K": (0, 2), "Q5_K": (0, 2), "Q6_K": (208,)}


def gguf_tensor(kind: str, seed: int = 0) -> np.ndarray:
    """(N, row bytes) raw blocks of `kind`: gguf's quantize of a random weight where it has one,
    else random bytes with small finite float16 scales (every code pattern is valid)."""
    rng = np.random.default_rng(seed)
    qtype = gguf.GGMLQuantizationType[kind]
    if kind not in F16_AT:
        return gguf.quants.quantize(rng.standard_normal((N, K)).astype(np.float32), qtype)
    block, size = gguf.GGML_QUANT_SIZES[qtype]
    raw = rng.integers(0, 256, (N * K // block, size), dtype=np.uint8)
    for at in F16_AT[kind]:
        scale = (rng.random((raw.shape[0], 1)) * 0.01).astype(np.float16)
        raw[:, at:at + 2] = scale.view(np.uint8)
    return raw.reshape(N, -1)


def block_minimums(kind: str, raw: np.ndarray) -> np.ndarray:
    """(N, K / 32) the minimum dequantize adds to a 32-block (0 where the type has none), read
    with gguf's own helpers: the part of a weight MatMulNBits multiplies is w minus it."""
    qtype = gguf.GGMLQuantizationType[kind]
    blocks = raw.reshape(-1, gguf.GGML_QUANT_SIZES[qtype][1])
    if kind in ("Q4_1", "Q5_1"):
        return blocks[:, 2:4].copy().view(np.float16).astype(np.float64).reshape(N, -1)
    if kind in ("Q4_K", "Q5_K"):
        dmin = blocks[:, 2:4].copy().view(np.float16).astype(np.float64)
        _, mins = gguf.quants.Q4_K.get_scale_min(blocks[:, 4:16].copy())
        return -(dmin * mins).reshape(N, -1)
    return np.zeros((N, K // 32))


def run(kind: str, raw: np.ndarray, x: np.ndarray, accuracy_level: int) -> np.ndarray:
    """x @ W^T through one MatMulNBits (+ the minimum term) in ONNX Runtime's CPU kernel."""
    nodes, inits = nbits_nodes(to_matmul_nbits("blk.0.w", kind, raw, (N, K)), "x", "y", "w",
                               accuracy_level=accuracy_level)
    lead = [f"d{i}" for i in range(x.ndim - 1)]
    graph = helper.make_graph(
        nodes, "gguf_blocks", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [*lead, K])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [*lead, N])], inits)
    model = helper.make_model(graph, ir_version=10, opset_imports=[
        helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)])
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    session = ort.InferenceSession(model.SerializeToString(), options,
                                   providers=["CPUExecutionProvider"])
    return session.run(None, {"x": x})[0]


@pytest.mark.parametrize("kind", MAPPED)
def test_the_graphs_weights_are_the_files_bit_for_bit(kind: str) -> None:
    raw = gguf_tensor(kind)
    expected = gguf.quants.dequantize(raw, gguf.GGMLQuantizationType[kind])
    assert np.isfinite(expected).all() and np.ptp(expected) > 0
    weights = run(kind, raw, np.eye(K, dtype=np.float32), accuracy_level=0).T
    # + 0.0 folds -0.0 into 0.0 (a zero row of I adds +0.0); every other bit must match
    assert np.array_equal((weights + 0.0).view(np.uint32), (expected + 0.0).view(np.uint32))


@pytest.mark.parametrize("kind", MAPPED)
def test_int8_activations_stay_within_their_rounding(kind: str) -> None:
    """accuracy_level 4 rounds each activation block to int8 (a step of max|x_block| / 127), so
    an output moves by at most half a step times sum|w| per block; bounded here per output."""
    raw = gguf_tensor(kind, seed=1)
    weight = gguf.quants.dequantize(raw, gguf.GGMLQuantizationType[kind]).astype(np.float64)
    x = np.random.default_rng(2).standard_normal((2, 3, K)).astype(np.float32)
    got = run(kind, raw, x, accuracy_level=4)
    exact = x.astype(np.float64) @ weight.T
    block = 16 if kind == "Q6_K" else 32
    step = np.abs(x).reshape(2, 3, K // block, block).max(-1) / 127  # (2, 3, blocks)
    # the minimum term runs in fp32 on x itself: only d*q = w - minimum meets int8 activations
    scaled = weight - np.repeat(block_minimums(kind, raw), 32, axis=1)
    bound = 0.5 * step @ np.abs(scaled).reshape(N, K // block, block).sum(-1).T + 1e-4
    assert got.shape == exact.shape
    assert (np.abs(got - exact) <= bound).all()
    assert not np.array_equal(got, run(kind, raw, x, accuracy_level=0))  # int8 path, not fp32


@pytest.mark.parametrize("kind", MAPPED)
def test_an_embedding_gathers_the_files_rows_bit_for_bit(kind: str) -> None:
    """The same blocks as an embedding table of N rows: GatherBlockQuantized (+ the minimums)."""
    raw = gguf_tensor(kind, seed=3)
    table = gguf.quants.dequantize(raw, gguf.GGMLQuantizationType[kind])
    nodes, inits = gather_nodes(to_matmul_nbits("token_embd.weight", kind, raw, (N, K)),
                                "ids", "y", "embed")
    graph = helper.make_graph(
        nodes, "gather", [helper.make_tensor_value_info("ids", TensorProto.INT64, ["b", "s"])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["b", "s", K])], inits)
    model = helper.make_model(graph, ir_version=10, opset_imports=[
        helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)])
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    ids = np.array([[5, 0, N - 1], [7, 7, 2]], np.int64)
    rows = session.run(None, {"ids": ids})[0]
    assert np.array_equal(rows.view(np.uint32), table[ids].view(np.uint32))


def test_an_exported_graphs_matmuls_take_the_files_blocks() -> None:
    """A layer as an exporter writes it (MatMul by W^T under its own initializer name) and a
    MatMul the file has no blocks for: the first becomes MatMulNBits, the second stays, and the
    graph computes the file's weights bit for bit (x = I, fp32 path)."""
    raw = gguf_tensor("Q4_1", seed=4)
    weights = {"blk.0.a": gguf.quants.dequantize(raw, gguf.GGMLQuantizationType.Q4_1)}
    other = np.random.default_rng(6).standard_normal((N, N)).astype(np.float32)
    inits = [numpy_helper.from_array(np.ascontiguousarray(weights["blk.0.a"].T), "onnx::MatMul_7"),
             numpy_helper.from_array(other, "onnx::MatMul_8")]
    nodes = [helper.make_node("MatMul", ["x", "onnx::MatMul_7"], ["h"]),
             helper.make_node("MatMul", ["h", "onnx::MatMul_8"], ["y"])]
    outputs = [helper.make_tensor_value_info(name, TensorProto.FLOAT, [None, N]) for name in "hy"]
    graph = helper.make_graph(
        nodes, "layers", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [None, K])],
        outputs, inits)
    model = helper.make_model(graph, ir_version=10, opset_imports=[
        helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)])
    forms = {"blk.0.a": to_matmul_nbits("blk.0.a", "Q4_1", raw, (N, K))}
    assert replace_matmuls(model, forms, weights, accuracy_level=0) == {
        "blk.0.a": "onnx::MatMul_7"}
    ops = [node.op_type for node in model.graph.node]
    assert ops.count("MatMulNBits") == 1 and ops[-1] == "MatMul"
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    hidden, _ = session.run(None, {"x": np.eye(K, dtype=np.float32)})
    assert np.array_equal(hidden.T, weights["blk.0.a"])


def test_a_type_with_no_exact_form_is_refused_by_name() -> None:
    raw = np.zeros((N, K // 256 * 84), np.uint8)  # Q2_K's 84-byte blocks
    with pytest.raises(ZooError) as info:
        to_matmul_nbits("blk.3.ffn_down.weight", "Q2_K", raw, (N, K))
    message = str(info.value)
    assert "blk.3.ffn_down.weight" in message and "Q2_K" in message and "\n" not in message


def test_bytes_that_are_not_the_shape_are_one_line() -> None:
    raw = gguf_tensor("Q8_0")[:, :-34]  # one block short a row
    with pytest.raises(ZooError, match=r"^blk\.0\.w: .* Q8_0 .* 24 x 512"):
        to_matmul_nbits("blk.0.w", "Q8_0", raw, (N, K))


@pytest.mark.parametrize("kind", ["Q8_0", "Q5_0", "Q5_1", "Q5_K", "Q6_K"])
def test_eight_bit_forms_take_float_activations_as_two_four_bit_halves(kind: str) -> None:
    """At accuracy_level 0 an 8-bit form runs as 4-bit halves on [x, x] (ONNX Runtime's fast
    float32 path): the products are float32's x @ W^T, not int8's."""
    raw = gguf_tensor(kind, seed=3)
    weight = gguf.quants.dequantize(raw, gguf.GGMLQuantizationType[kind]).astype(np.float64)
    x = np.random.default_rng(4).standard_normal((2, 3, K)).astype(np.float32)
    exact = x.astype(np.float64) @ weight.T
    nodes, _ = nbits_nodes(to_matmul_nbits("blk.0.w", kind, raw, (N, K)), "x", "y", "w", 0)
    nbits = next(node for node in nodes if node.op_type == "MatMulNBits")
    attrs = {a.name: helper.get_attribute_value(a) for a in nbits.attribute}
    assert (attrs["bits"], attrs["K"]) == (4, 2 * K) and nodes[0].op_type == "Concat"
    got = run(kind, raw, x, accuracy_level=0)
    assert np.abs(got - exact).max() <= 1e-5 * np.abs(x).max() * np.abs(weight).sum(1).max()
