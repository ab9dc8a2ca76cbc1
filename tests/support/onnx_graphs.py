"""ONNX graphs read back or made by hand: MatMulNBits weights as ONNX Runtime computes with them, a
stacked mixture of experts."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper


def nbits_weights(model: onnx.ModelProto) -> list[tuple[str, np.ndarray]]:
    """(node name, (N, K) weights) of every MatMulNBits: the node alone in ONNX Runtime at
    accuracy_level 0 on x = I, plus the block minimums its graph adds (`*.minimums`)."""
    inits = {tensor.name: numpy_helper.to_array(tensor) for tensor in model.graph.initializer}
    found = []
    for node in model.graph.node:
        if node.op_type != "MatMulNBits":
            continue
        attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
        k, n = attrs["K"], attrs["N"]
        alone = helper.make_node("MatMulNBits", ["x", *node.input[1:]], ["y"],
                                 domain="com.microsoft", **{**attrs, "accuracy_level": 0})
        graph = helper.make_graph(
            [alone], "alone", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [k, k])],
            [helper.make_tensor_value_info("y", TensorProto.FLOAT, [k, n])],
            [numpy_helper.from_array(inits[name], name) for name in node.input[1:]])
        proto = helper.make_model(graph, ir_version=10, opset_imports=[
            helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)])
        session = ort.InferenceSession(proto.SerializeToString(),
                                       providers=["CPUExecutionProvider"])
        weight = session.run(None, {"x": np.eye(k, dtype=np.float32)})[0].T
        if node.input[0].endswith(".halves"):  # an 8-bit form as 4-bit halves on [x, x]
            weight = weight[:, :k // 2] + weight[:, k // 2:]
        prefix = node.name.removesuffix(".MatMulNBits")
        if f"{prefix}.minimums" in inits:
            block = attrs["block_size"]
            weight = weight + np.repeat(inits[f"{prefix}.minimums"].T, block, axis=1)
        found.append((prefix, weight))
    return found


def stacked_moe(gate: np.ndarray, up: np.ndarray, down: np.ndarray) -> onnx.ModelProto:
    """A MoE node whose weights arrive as the trace of a real-sized model gives them (the
    exporter folds only small tensors): per expert, gate and up rows interleaved by Unsqueeze,
    Concat and Reshape, then the experts stacked by Unsqueeze and Concat."""
    n_experts, d_ff, d = gate.shape
    nodes, inits, rows1, rows2 = [], [], [], []
    for e in range(n_experts):
        inits += [numpy_helper.from_array(w[e], f"{kind}{e}") for kind, w in
                  (("gate", gate), ("up", up), ("down", down))]
        nodes += [helper.make_node("Unsqueeze", [f"gate{e}", "one"], [f"g{e}"]),
                  helper.make_node("Unsqueeze", [f"up{e}", "one"], [f"u{e}"]),
                  helper.make_node("Concat", [f"g{e}", f"u{e}"], [f"gu{e}"], axis=1),
                  helper.make_node("Reshape", [f"gu{e}", "rows"], [f"fc1_{e}"]),
                  helper.make_node("Unsqueeze", [f"fc1_{e}", "zero"], [f"s1_{e}"]),
                  helper.make_node("Unsqueeze", [f"down{e}", "zero"], [f"s2_{e}"])]
        rows1.append(f"s1_{e}")
        rows2.append(f"s2_{e}")
    nodes += [helper.make_node("Concat", rows1, ["fc1"], axis=0),
              helper.make_node("Concat", rows2, ["fc2"], axis=0),
              helper.make_node("MoE", ["x", "logits", "fc1", "", "fc2"], ["y"], name="moe",
                               domain="com.microsoft", k=2, activation_type="swiglu",
                               swiglu_fusion=1, normalize_routing_weights=1,
                               activation_alpha=1.0, activation_beta=0.0, swiglu_limit=3.0e38)]
    inits += [numpy_helper.from_array(np.array(v, np.int64), n) for n, v in
              (("zero", [0]), ("one", [1]), ("rows", [2 * d_ff, d]))]
    graph = helper.make_graph(
        nodes, "stacked",
        [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [None, d]),
         helper.make_tensor_value_info("logits", onnx.TensorProto.FLOAT, [None, n_experts])],
        [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [None, d])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18),
                                                   helper.make_opsetid("com.microsoft", 1)],
                             ir_version=10)
