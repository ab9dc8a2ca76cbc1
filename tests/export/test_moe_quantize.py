"""--optimize --quantize int4/int8 on moe-tiny: model_kv.onnx's experts are ONNX Runtime's QMoE
holding the round-to-nearest quantization of the fp32 experts (export/onnx/quantize_experts.py),
the node computes the mixture on those weights, and the export passes the int4/int8 gate
against fp32 PyTorch on that graph."""

from __future__ import annotations

import json

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import helper, numpy_helper

from export.checks.agreement import THRESHOLDS
from export.checks.verify import check_agreement
from export.onnx.shared_cache import KV_FILE
from export.opening import open_export, open_model
from tests.conftest import SharedExport, card, on_shared
from tests.support.onnx_graphs import stacked_moe
from zoo.assemble import build_model
from zoo.blocks.experts import moe_blocks
from zoo.files.weights import load_built

pytestmark = on_shared("moe-tiny")
VARIANTS = ["int4", pytest.param("int8", marks=pytest.mark.slow)]
BLOCK = 16  # moe-tiny's moe_d_ff 48 is no multiple of the other weights' 32


def reference_quantized(weight: np.ndarray, bits: int, block: int) -> np.ndarray:
    """Symmetric round to nearest per block of `block` along a row, dequantized: the scale maps
    the block's largest-magnitude value to -2^(bits-1), values are rounded (half away from
    zero) to integers in [-2^(bits-1), 2^(bits-1) - 1]. In float32 as MLAS computes it,
    w * (1 / scale) + 2^(bits-1) then rounded, so float32 ties round alike."""
    rows, k = weight.shape
    blocks = weight.reshape(rows, k // block, block).astype(np.float32)
    largest = np.take_along_axis(blocks, np.abs(blocks).argmax(-1)[..., None], -1)
    half = np.float32(2 ** (bits - 1))
    scale = -largest / half
    reciprocal = np.divide(np.float32(1), scale, out=np.zeros_like(scale), where=scale != 0)
    q = np.clip(np.floor(blocks * reciprocal + half + np.float32(0.5)), 0, 2 * half - 1)
    return ((q - half) * scale).reshape(rows, k)


def node_dequantized(packed: np.ndarray, scales: np.ndarray, bits: int) -> np.ndarray:
    """QMoE's (experts, rows, K * bits / 8) uint8 and (experts, rows, K / block) scales as
    (experts, rows, K) floats: (q - 2^(bits-1)) * scale, two 4-bit values a byte, low first."""
    values = np.stack([packed & 15, packed >> 4], -1) if bits == 4 else packed
    values = values.reshape(*packed.shape[:2], scales.shape[2], -1).astype(np.float32)
    return ((values - 2 ** (bits - 1)) * scales[..., None]).reshape(*packed.shape[:2], -1)


def expert_matrices(layer: int) -> tuple[np.ndarray, np.ndarray]:
    """moe-tiny's (as shared_export builds it) fp32 experts of a layer: fc1 (E, 2F, d) with the
    gate and up rows interleaved, fc2 (E, d, F)."""
    block = moe_blocks(build_model(card("moe-tiny"), seed=1))[layer]
    fc1 = np.stack([np.stack([e.gate.weight.detach().numpy(), e.up.weight.detach().numpy()],
                             axis=1).reshape(-1, e.gate.weight.shape[1]) for e in block.experts])
    fc2 = np.stack([e.down.weight.detach().numpy() for e in block.experts])
    return fc1, fc2


def qmoe_nodes(folder) -> tuple[list[onnx.NodeProto], dict[str, np.ndarray]]:  # noqa: ANN001
    graph = onnx.load(str(folder / KV_FILE)).graph
    arrays = {t.name: numpy_helper.to_array(t) for t in graph.initializer}
    assert not [n.name for n in graph.node if n.op_type == "MoE"]  # no fp32 experts left
    return [n for n in graph.node if n.op_type == "QMoE"], arrays


@pytest.mark.parametrize("variant", VARIANTS)
def test_the_experts_are_the_round_to_nearest_quantization_of_the_fp32_ones(
        variant: str, shared_export: SharedExport) -> None:
    bits = int(variant[3:])
    folder, _ = shared_export("moe-tiny", f"optimize-{variant}")
    nodes, arrays = qmoe_nodes(folder)
    assert len(nodes) == card("moe-tiny")["n_layers"]
    for layer, node in enumerate(nodes):
        attributes = {a.name: helper.get_attribute_value(a) for a in node.attribute}
        assert node.domain == "com.microsoft"
        assert {key: attributes[key] for key in ("expert_weight_bits", "block_size",
                                                 "accuracy_level", "k", "swiglu_fusion",
                                                 "normalize_routing_weights")} == {
            "expert_weight_bits": bits, "block_size": BLOCK, "accuracy_level": 4, "k": 2,
            "swiglu_fusion": 1, "normalize_routing_weights": 1}
        assert attributes["activation_type"] == b"swiglu"
        for weights, scales, fp32 in zip(node.input[2:7:3], node.input[3:7:3],
                                         expert_matrices(layer), strict=True):
            expected = np.stack([reference_quantized(m, bits, BLOCK) for m in fp32])
            packed = arrays[weights]
            assert packed.dtype == np.uint8 and packed.shape == (*fp32.shape[:2],
                                                                 fp32.shape[2] * bits // 8)
            np.testing.assert_array_equal(node_dequantized(packed, arrays[scales], bits),
                                          expected)
    quantization = json.loads((folder / "manifest.json").read_text())["quantization"]
    assert quantization["experts"]["files"] == {KV_FILE: {"qmoe": 2, "block_size": [BLOCK]}}


def mixture(x: np.ndarray, logits: np.ndarray, fc1: np.ndarray, fc2: np.ndarray,
            k: int) -> np.ndarray:
    """numpy: softmax, top k renormalised, silu(gate) * up of the chosen experts."""
    probabilities = np.exp(logits - logits.max(-1, keepdims=True))
    probabilities /= probabilities.sum(-1, keepdims=True)
    out = np.zeros_like(x, dtype=np.float64)
    for t in range(len(x)):
        chosen = np.argsort(-probabilities[t])[:k]
        weights = probabilities[t, chosen] / probabilities[t, chosen].sum()
        for expert, weight in zip(chosen, weights, strict=True):
            hidden = fc1[expert] @ x[t]
            gate, up = hidden[0::2], hidden[1::2]
            out[t] += weight * (fc2[expert] @ (gate / (1 + np.exp(-gate)) * up))
    return out


@pytest.mark.parametrize("variant", VARIANTS)
def test_the_qmoe_node_computes_the_mixture_of_those_weights(
        variant: str, shared_export: SharedExport, monkeypatch: pytest.MonkeyPatch) -> None:
    """The exported node alone on random tokens, against numpy on the reference weights. Its
    activations in fp32 (the kernel's switch for it), so the comparison is exact to float
    rounding; as exported (int8 activation blocks) it stays within a few percent."""
    bits = int(variant[3:])
    folder, _ = shared_export("moe-tiny", f"optimize-{variant}")
    nodes, arrays = qmoe_nodes(folder)
    node = nodes[0]
    d, n_experts = card("moe-tiny")["d_model"], card("moe-tiny")["n_experts"]
    alone = helper.make_graph(
        [helper.make_node("QMoE", ["x", "logits", *node.input[2:]], ["y"], domain=node.domain,
                          name="experts", **{a.name: helper.get_attribute_value(a)
                                             for a in node.attribute})], "experts",
        [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [None, d]),
         helper.make_tensor_value_info("logits", onnx.TensorProto.FLOAT, [None, n_experts])],
        [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [None, d])],
        [numpy_helper.from_array(arrays[name], name) for name in node.input[2:] if name])
    model = helper.make_model(alone, opset_imports=[helper.make_opsetid("", 18),
                                                    helper.make_opsetid(node.domain, 1)],
                              ir_version=10)
    rng = np.random.default_rng(0)
    x = rng.standard_normal((9, d)).astype(np.float32)
    logits = rng.standard_normal((9, n_experts)).astype(np.float32)
    fc1, fc2 = (np.stack([reference_quantized(m, bits, BLOCK) for m in fp32])
                for fp32 in expert_matrices(0))
    expected = mixture(x.astype(np.float64), logits, fc1, fc2, k=2)

    def run() -> np.ndarray:
        session = ort.InferenceSession(model.SerializeToString(),
                                       providers=["CPUExecutionProvider"])
        return session.run(None, {"x": x, "logits": logits})[0]

    exported = run()
    monkeypatch.setenv("ORT_QMOE_CPU_QNBIT_GEMM", "0")  # read when the kernel is built
    np.testing.assert_allclose(run(), expected, rtol=1e-5, atol=1e-5)
    assert np.abs(exported - expected).max() < 0.05 * np.abs(expected).max()


@pytest.mark.parametrize("variant", VARIANTS)
def test_the_quantized_moe_export_passes_the_gate_on_its_qmoe_graph(
        variant: str, shared_export: SharedExport) -> None:
    """Against fp32 PyTorch, with the dense models' int4/int8 thresholds: top-1 and top-5 along
    the fp32 model's greedy continuation (teacher-forced), decoded by the shared-cache loop,
    which runs model_kv.onnx and so its QMoE; measured again here, not read from the export."""
    folder, report = shared_export("moe-tiny", f"optimize-{variant}")
    assert any("QMoE" in note for note in report.notes)
    runtime = open_export(folder)
    assert runtime.kv_graph is not None
    model, loaded = load_built(folder)
    agreement = check_agreement(open_model(model, loaded), runtime, variant)
    assert agreement.thresholds == THRESHOLDS[variant] and agreement.passed
    row = agreement.rows[0]
    assert row.positions == 64 and 0 < row.max_logit_diff < 1


def test_experts_stacked_by_nodes_are_read_quantized_and_the_stack_removed(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A real model's MoE weights are a stack of nodes over the experts' own initializers, not
    one initializer: they are evaluated, quantized (blocks of 32, as the other weights, where
    the sizes allow) and the stacking nodes dropped; the node computes the numpy mixture."""
    from export.onnx.quantize_experts import quantize_experts

    rng = np.random.default_rng(3)
    gate, up = (rng.standard_normal((3, 32, 64)).astype(np.float32) * 0.1 for _ in range(2))
    down = rng.standard_normal((3, 64, 32)).astype(np.float32) * 0.1
    model = stacked_moe(gate, up, down)
    assert quantize_experts(model, 4, 4) == 1
    assert [(n.op_type, n.name) for n in model.graph.node] == [("QMoE", "moe")]
    attributes = {a.name: helper.get_attribute_value(a) for a in model.graph.node[0].attribute}
    assert attributes["block_size"] == 32 and attributes["expert_weight_bits"] == 4
    arrays = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    fc1 = np.stack([np.stack([g, u], axis=1).reshape(64, 64) for g, u in zip(gate, up,
                                                                              strict=True)])
    expected = [np.stack([reference_quantized(m, 4, 32) for m in w]) for w in (fc1, down)]
    node = model.graph.node[0]
    for weights, scales, want in zip(node.input[2:7:3], node.input[3:7:3], expected,
                                     strict=True):
        np.testing.assert_array_equal(node_dequantized(arrays[weights], arrays[scales], 4), want)
    x = rng.standard_normal((5, 64)).astype(np.float32)
    logits = rng.standard_normal((5, 3)).astype(np.float32)
    monkeypatch.setenv("ORT_QMOE_CPU_QNBIT_GEMM", "0")
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    np.testing.assert_allclose(session.run(None, {"x": x, "logits": logits})[0],
                               mixture(x.astype(np.float64), logits, *expected, k=2),
                               rtol=1e-5, atol=1e-5)
