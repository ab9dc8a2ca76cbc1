"""--quantize int4/int8 for the experts of --optimize's shared-cache graph: each
`com.microsoft.MoE` node (export/onnx/experts.py) becomes `com.microsoft.QMoE` with the same
routing and SwiGLU attributes, its 3-D expert weights quantized as every other linear weight
is (export/onnx/quantize.py: ONNX Runtime's own blockwise quantizer, symmetric, one fp32 scale
per block along the input dimension, accuracy_level 4). The MatMulNBits quantizer does not
reach them: they are 3-D initializers of one node, not MatMul weights.

What ONNX Runtime 1.31's CPU kernel takes (measured on one node against numpy):
- fc1 (experts, 2 * moe_d_ff, d_model * bits / 8) uint8, gate and up rows interleaved
  (swiglu_fusion 1, as in the MoE node); fc2 (experts, d_model, moe_d_ff * bits / 8). Each row
  is one output feature, its input features packed along it, 4-bit low nibble first: an
  expert's matrix is MatMulNBits' B (N, blocks, block * bits / 8) flattened per row.
- scales (experts, rows, K / block_size) with the `block_size` attribute; no zero points: the
  kernel's default is MatMulNBits' symmetric one (8 for 4 bits, 128 for 8), and it dequantizes
  (q - zero point) * scale.
- block_size must divide both d_model and moe_d_ff (the quantizer pads the last block; this
  kernel refuses it): 32 as for the other weights, else 16 (moe-tiny's 48), else the layer's
  experts stay fp32 and the export says so (per node, why: left_experts; the manifest's
  `quantization.experts` lists them under `fp32`).
- It renormalises the top k weights even with normalize_routing_weights 0 (measured): the
  MoE node is always emitted with 1 (export/onnx/experts.py rescales OLMoE's after it); a
  node with 0 would be left as it is.
- With every activation in fp32 (ORT_QMOE_CPU_QNBIT_GEMM=0) it matched numpy on the
  dequantized weights within 3e-6, both widths. As exported (accuracy_level 4, int8
  activation blocks, which 8-bit experts use at every level) it is within what MatMulNBits'
  own int8 activations give; the export's agreement check gates it like any int4/int8 graph.

Measured (moe-tiny scaled to d_model 512, moe_d_ff 1024, 8 experts, 2 layers, random weights;
one run on a loaded 2-core machine): onnx/ 118 MB with fp32 experts in model_kv.onnx, 33 MB
as QMoE (int4); a decoding step of model_kv.onnx 1.9 ms with the fp32 MoE, 0.25 ms with int4
QMoE, 0.6 ms int8. Agreement with fp32 PyTorch equals the plain graph's, whose experts are
MatMulNBits (int4 top-1 0.45 / 0.44, top-5 0.91 / 0.92; int8 0.95 / 0.94).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx
from onnx import helper, numpy_helper
from onnx.reference import ReferenceEvaluator

from export.onnx.experts import OPERATOR
from export.onnx.gguf_blocks import NBitsForm, widened
from registry.errors import ZooError

DOMAIN, MOE = OPERATOR.rsplit(".", 1)
QUANTIZED = "QMoE"
EXPERT_BLOCKS = (32, 16)  # the kernel's blocks (powers of two >= 16); the first that fits
FC1, FC1_BIAS, FC2, FC2_BIAS = 2, 3, 4, 5  # the MoE node's inputs
# torch.stack of the experts' weights (and the gate/up interleave) as traced; the exporter folds
# it into one initializer only for small tensors (moe-tiny), a real model's arrives as these
FOLDABLE = {"Unsqueeze", "Concat", "Reshape", "Transpose", "Identity"}


def expert_block(d_model: int, moe_d_ff: int) -> int | None:
    """The block size the kernel can take for both matrices of an expert, or None."""
    return next((block for block in EXPERT_BLOCKS if d_model % block == moe_d_ff % block == 0),
                None)


def quantized_rows(weight: np.ndarray, bits: int, block: int) -> tuple[np.ndarray, np.ndarray]:
    """(rows, K) fp32 -> (rows, K * bits / 8) uint8 and (rows, K / block) fp32 scales, by ONNX
    Runtime's quantizer (the one MatMulNBitsQuantizer calls: the same numbers as the other
    weights), symmetric."""
    from onnxruntime.capi._pybind_state import quantize_matmul_4bits, quantize_matmul_8bits

    rows, k = weight.shape
    blocks = k // block
    packed = np.zeros((rows, blocks, block * bits // 8), np.uint8)
    scales = np.zeros((rows, blocks), np.float32)
    zero_points = np.zeros((rows, (blocks * bits + 7) // 8), np.uint8)  # unused: symmetric
    quantizer = quantize_matmul_4bits if bits == 4 else quantize_matmul_8bits
    quantizer(packed, np.ascontiguousarray(weight.T, dtype=np.float32), scales, zero_points,
              block, rows, k, True)
    return packed.reshape(rows, -1), scales


def _quantized_experts(weights: np.ndarray, name: str, bits: int, block: int
                       ) -> tuple[onnx.TensorProto, onnx.TensorProto]:
    """(experts, rows, K) fp32 as the QMoE weight and scale initializers."""
    pairs = [quantized_rows(matrix, bits, block) for matrix in weights]
    return (numpy_helper.from_array(np.stack([p for p, _ in pairs]), f"{name}.q{bits}"),
            numpy_helper.from_array(np.stack([s for _, s in pairs]), f"{name}.scales"))


def constant_value(model: onnx.ModelProto, name: str) -> np.ndarray | None:
    """The value of tensor `name` where initializers alone make it, through FOLDABLE nodes
    (evaluated by onnx's reference evaluator); None where it reads anything else."""
    graph = model.graph
    initializers = {tensor.name: tensor for tensor in graph.initializer}
    if name in initializers:
        return numpy_helper.to_array(initializers[name])
    producers = {output: index for index, node in enumerate(graph.node) for output in node.output}
    needed: set[int] = set()
    pending = [name]
    while pending:
        current = pending.pop()
        if not current or current in initializers:
            continue
        index = producers.get(current)
        if index is None:
            return None  # a graph input
        node = graph.node[index]
        if node.op_type not in FOLDABLE or node.domain:
            return None
        if index not in needed:
            needed.add(index)
            pending.extend(node.input)
    order = [graph.node[index] for index in sorted(needed)]  # graph order is topological
    read = {value for node in order for value in node.input}
    output = helper.make_value_info(name, onnx.TypeProto())
    subgraph = helper.make_graph(order, "constant", [], [output],
                                 [initializers[value] for value in read if value in initializers])
    evaluator = ReferenceEvaluator(helper.make_model(subgraph, opset_imports=model.opset_import))
    return evaluator.run(None, {})[0]


def drop_dead_nodes(graph: onnx.GraphProto) -> None:
    """Nodes whose outputs nothing reads (the stack that fed a replaced MoE node's weights)."""
    while True:
        read = {output.name for output in graph.output}
        read.update(value for node in graph.node for value in node.input)
        dead = [node for node in graph.node if not any(output in read for output in node.output)]
        if not dead:
            return
        for node in dead:
            graph.node.remove(node)


def quantize_experts(model: onnx.ModelProto, bits: int, accuracy_level: int) -> int:
    """Every MoE node of `model` with constant expert weights whose sizes a block fits becomes
    QMoE, in place; returns how many (left_experts says why each other node stays). The fp32
    weights are left as unused initializers for the caller's clean-up; the nodes that stacked
    them are removed."""
    graph = model.graph
    count = 0
    for node in moe_nodes(graph):
        found = constant_experts(model, node)
        block = found if isinstance(found, str) else fitting_block(*found)
        if isinstance(block, str):
            continue
        fc1, fc2 = found
        weights1, scales1 = _quantized_experts(fc1, node.input[FC1], bits, block)
        weights2, scales2 = _quantized_experts(fc2, node.input[FC2], bits, block)
        graph.initializer.extend([weights1, scales1, weights2, scales2])
        _replace(graph, node, [weights1.name, scales1.name, weights2.name, scales2.name],
                 node.name, bits, block, accuracy_level)
        count += 1
    drop_dead_nodes(graph)
    return count


def left_experts(model: onnx.ModelProto) -> dict[str, str]:
    """{MoE node name: why quantize_experts left it fp32} (the same checks that decided)."""
    left = {}
    for node in moe_nodes(model.graph):
        found = constant_experts(model, node)
        why = found if isinstance(found, str) else fitting_block(*found)
        left[node.name] = why if isinstance(why, str) else "not quantized"
    return left


def moe_nodes(graph: onnx.GraphProto) -> list[onnx.NodeProto]:
    return [node for node in graph.node if node.domain == DOMAIN and node.op_type == MOE]


def constant_experts(model: onnx.ModelProto, node: onnx.NodeProto
                     ) -> tuple[np.ndarray, np.ndarray] | str:
    """The node's (fc1, fc2) weights, or why QMoE cannot take them."""
    if not _renormalised(node):
        return "its normalize_routing_weights is 0, which QMoE's kernel does not honour"
    fc1, fc2 = (constant_value(model, node.input[index]) for index in (FC1, FC2))
    if fc1 is None or fc2 is None:
        return "its expert weights are not constants (they read a graph input)"
    return fc1, fc2


def fitting_block(fc1: np.ndarray, fc2: np.ndarray) -> int | str:
    """The kernel's block for these weights, or why none fits."""
    d_model, moe_d_ff = fc1.shape[2], fc2.shape[2]
    block = expert_block(d_model, moe_d_ff)
    return block if block is not None else (
        f"no block of {' or '.join(map(str, EXPERT_BLOCKS))} divides both d_model {d_model} "
        f"and moe_d_ff {moe_d_ff}")


def _replace(graph: onnx.GraphProto, node: onnx.NodeProto, weights: list[str], name: str,
             bits: int, block: int, accuracy_level: int) -> None:
    """The MoE `node` as a QMoE node reading `weights` (fc1, its scales, fc2, its scales)."""
    inputs = [*node.input[:FC1], weights[0], weights[1], _optional(node, FC1_BIAS),
              weights[2], weights[3], _optional(node, FC2_BIAS)]
    quantized = helper.make_node(QUANTIZED, inputs, list(node.output), name=name,
                                 domain=DOMAIN, expert_weight_bits=bits, block_size=block,
                                 accuracy_level=accuracy_level)
    quantized.attribute.extend(node.attribute)  # k, routing, SwiGLU: as the MoE node's
    index = list(graph.node).index(node)
    graph.node.remove(node)
    graph.node.insert(index, quantized)


def expert_nodes(graph: onnx.GraphProto) -> tuple[int, int]:
    """(QMoE nodes, MoE nodes left fp32) in `graph`."""
    ops = [node.op_type for node in graph.node if node.domain == DOMAIN]
    return ops.count(QUANTIZED), ops.count(MOE)


def _renormalised(node: onnx.NodeProto) -> bool:
    """The kernel renormalises the top k whatever normalize_routing_weights says (measured:
    with 0 it gave the renormalised mixture), so only such a node keeps its meaning."""
    return any(a.name == "normalize_routing_weights" and a.i == 1 for a in node.attribute)


def _optional(node: onnx.NodeProto, index: int) -> str:
    return node.input[index] if len(node.input) > index else ""


def experts_entry(protos: dict[str, onnx.ModelProto], choice: str,
                  entry: dict[str, object]) -> list[str]:
    """Add the quantized experts to the manifest's quantization `entry`; the notes to print."""
    notes, left = [], {}
    for file, proto in protos.items():
        quantized, _ = expert_nodes(proto.graph)
        left[file] = left_experts(proto)
        if quantized:
            blocks = ", ".join(map(str, _attribute_values(proto.graph, "block_size")))
            notes.append(f"quantized the experts of {quantized} MoE layers in {file} to {choice} "
                         f"(QMoE, blocks of {blocks})")
        notes += left_notes(file, left[file])
    described = experts_object(protos, left, "round to nearest by ONNX Runtime's blockwise "
                                             "quantizer, as the MatMul weights")
    if described:
        entry["experts"] = described
    return notes


def left_notes(file: str, left: dict[str, str]) -> list[str]:
    """One note per reason for the MoE nodes (or layers) `left` fp32 in `file`."""
    reasons: dict[str, int] = {}
    for why in left.values():
        reasons[why] = reasons.get(why, 0) + 1
    return [f"note: {file}: the experts of {count} MoE layers stay fp32: {why}"
            for why, count in reasons.items()]


def experts_object(protos: dict[str, onnx.ModelProto], left: dict[str, dict[str, str]],
                   weights: str) -> dict[str, object] | None:
    """The manifest's `quantization.experts` (one shape for int4/int8 and gguf): per file with
    MoE nodes its QMoE count and block sizes, and (where any) the nodes or layers left fp32 with
    why; None where no graph has a MoE node."""
    files: dict[str, dict[str, object]] = {}
    for file, proto in protos.items():
        quantized, _ = expert_nodes(proto.graph)
        if quantized or left.get(file):
            files[file] = {"qmoe": quantized,
                           "block_size": _attribute_values(proto.graph, "block_size")} | (
                {"fp32": left[file]} if left.get(file) else {})
    if not files:
        return None
    bits = sorted({value for proto in protos.values()
                   for value in _attribute_values(proto.graph, "expert_weight_bits")})
    return {"operator": f"{DOMAIN}.{QUANTIZED}", "weights": weights,
            "expert_weight_bits": bits, "symmetric": True,
            "zero_points": "the kernel's default", "files": files}


def _attribute_values(graph: onnx.GraphProto, name: str) -> list[int]:
    """The distinct values of attribute `name` over the QMoE nodes of `graph`, sorted."""
    return sorted({attribute.i for node in graph.node if node.op_type == QUANTIZED
                   for attribute in node.attribute if attribute.name == name})


# --quantize gguf (export/onnx/gguf_export.py): a layer's experts as QMoE holding the GGUF
# file's own blocks. Q4_0 is d * (q - 8) and Q8_0 d * q (q int8, stored here as q + 128): the
# kernel's symmetric 4- and 8-bit forms with their default zero points, blocks of 32, one fp32
# scale (the file's float16 d) per block. One expert_weight_bits for fc1 and fc2: a layer that
# mixes the two is held at 8 bits, its Q4_0 codes plus 120 (gguf_blocks.widened), as exact.
GGUF_EXPERT_BITS = {"Q4_0": 4, "Q8_0": 8}


@dataclass(frozen=True)
class GGUFExperts:
    """One layer's experts in the file's forms (per expert), and its fp32 down weights (per
    expert, (d_model, moe_d_ff): references, not copies), by which its MoE node is found."""

    prefix: str  # "layers.0.feed_forward.experts"
    gate: list[NBitsForm]
    up: list[NBitsForm]
    down: list[NBitsForm]
    fc2: list[np.ndarray]

    def holds(self, fc2: np.ndarray) -> bool:
        """`fc2` (experts, d_model, moe_d_ff) is this layer's down weights, value for value
        (the first row compared first: a real model's layers are large)."""
        return fc2.shape == (len(self.fc2), *self.fc2[0].shape) and np.array_equal(
            fc2[0, 0], self.fc2[0][0]) and all(
            np.array_equal(fc2[index], weight) for index, weight in enumerate(self.fc2))

    @property
    def bits(self) -> int:
        return max(form.bits for form in self.gate + self.up + self.down)

    def inexact(self) -> str | None:
        """Why QMoE cannot hold these experts' blocks exactly (their types), or None."""
        parts = {"gate": self.gate, "up": self.up, "down": self.down}
        types = {part: sorted({form.ggml_type for form in forms}) for part, forms in parts.items()}
        if all(kind in GGUF_EXPERT_BITS for kinds in types.values() for kind in kinds):
            return None
        listed = ", ".join(f"{part} {'/'.join(kinds)}" for part, kinds in types.items())
        return f"{listed}: QMoE holds Q4_0 and Q8_0 experts exactly, not these"


@dataclass(frozen=True)
class GGUFPlacement:
    """What place_gguf_experts did in one graph: {layer prefix: expert_weight_bits} of the
    layers now QMoE, and {layer prefix, or the MoE node's name where no layer is known: why}
    of those whose MoE node stays fp32."""

    qmoe: dict[str, int]
    left: dict[str, str]


def _stacked_rows(forms: list[NBitsForm], bits: int) -> tuple[np.ndarray, np.ndarray]:
    """Per expert (rows, K * bits / 8) codes and (rows, K / 32) scales, stacked."""
    held = [form if form.bits == bits else widened(form) for form in forms]
    return (np.stack([form.b.reshape(form.n, -1) for form in held]),
            np.stack([form.scales.reshape(form.n, -1) for form in held]))


def _interleaved_rows(gate: np.ndarray, up: np.ndarray) -> np.ndarray:
    """(E, F, x) each -> (E, 2F, x), gate row j at 2j and up row j at 2j + 1 (experts.py)."""
    return np.stack([gate, up], axis=2).reshape(gate.shape[0], -1, gate.shape[2])


def qmoe_dequantized(packed: np.ndarray, scales: np.ndarray, bits: int) -> np.ndarray:
    """(E, rows, K) float32 a QMoE weight holds as the kernel reads it: low nibble first,
    (q - 8) * scale for 4 bits, (q - 128) * scale for 8, a scale per block along K."""
    codes = packed if bits == 8 else np.stack([packed & 0x0F, packed >> 4], axis=-1).reshape(
        *packed.shape[:2], -1)
    experts, rows, k = codes.shape
    blocks = scales.shape[2]
    grouped = codes.reshape(experts, rows, blocks, k // blocks).astype(np.float32)
    zero = np.float32(2 ** (bits - 1))
    return ((grouped - zero) * scales[..., None]).reshape(experts, rows, k)


def place_gguf_experts(model: onnx.ModelProto, layers: list[GGUFExperts], accuracy_level: int,
                       file: str) -> GGUFPlacement:
    """Each MoE node whose fc2 is, value for value, a layer's stacked down weights of Q4_0 or
    Q8_0 blocks becomes a QMoE node of those blocks, in place, after checking bit for bit that
    they dequantize to the node's fp32 weights; returns what became of each node. A node of
    none of `layers` (the file's experts stored as floats) is left without a word."""
    graph = model.graph
    placement = GGUFPlacement({}, {})
    for node in moe_nodes(graph):
        found = constant_experts(model, node)
        if isinstance(found, str):
            placement.left[node.name] = found
            continue
        fc1, fc2 = found
        layer = next((layer for layer in layers if layer.holds(fc2)), None)
        if layer is None:
            continue
        if (why := layer.inexact()) is not None:
            placement.left[layer.prefix] = why
            continue
        bits, p = layer.bits, layer.prefix
        (gate, gate_scales), (up, up_scales) = (_stacked_rows(forms, bits)
                                                for forms in (layer.gate, layer.up))
        codes1, scales1 = _interleaved_rows(gate, up), _interleaved_rows(gate_scales, up_scales)
        codes2, scales2 = _stacked_rows(layer.down, bits)
        for codes, scales, weight, which in ((codes1, scales1, fc1, "fc1"),
                                             (codes2, scales2, fc2, "fc2")):
            held = qmoe_dequantized(codes, scales, bits) + np.float32(0.0)
            expected = np.asarray(weight, np.float32) + np.float32(0.0)
            if held.shape != expected.shape or not np.array_equal(
                    held.view(np.uint32), expected.view(np.uint32)):
                raise ZooError(f"{file}: {p}: the file's blocks as QMoE {which} do not give "
                               "the imported weights bit for bit (re-import the GGUF file)")
        inits = [numpy_helper.from_array(codes1, f"{p}.fc1.q{bits}"),
                 numpy_helper.from_array(scales1, f"{p}.fc1.scales"),
                 numpy_helper.from_array(codes2, f"{p}.fc2.q{bits}"),
                 numpy_helper.from_array(scales2, f"{p}.fc2.scales")]
        graph.initializer.extend(inits)
        _replace(graph, node, [init.name for init in inits], f"{p}.{QUANTIZED}", bits,
                 layer.down[0].block_size, accuracy_level)
        placement.qmoe[p] = bits
    drop_dead_nodes(graph)
    return placement
