"""`zoo export --dtype fp16`: every graph's weights and activations in float16, with the parts
that need float32 kept there, as transformers' fp16 path computes them (and as the zoo's blocks
do when the PyTorch model itself runs in float16, the reference the parity check compares to):

- positions and masks: whatever is computed from the position ids, the attention masks and
  shapes alone (rotary angles and their cos/sin, position tables, the additive masks whose
  lowest value float16 cannot hold) stays float32 and is cast once where it meets an
  activation: an angle of 1,000 radians in float16 is off by 0.25;
- the softmax and the Add that puts the mask on its scores (transformers' eager attention
  takes its softmax in float32);
- the RMS norms' mean of squares, square root and division (transformers' RMSNorm computes in
  float32; x^2 overflows float16 past 256).

ONNX Runtime's own converter (onnxruntime.transformers.float16, what its optimizer and
Optimum's fp16 exports use) does the rewriting, with those nodes on its block list; fused
operators (SimplifiedLayerNormalization, GroupQueryAttention, MatMulNBits) compute in float32
inside their kernels. Inputs and outputs become float16 too (the cache included), as
transformers.js and Optimum's fp16 exports take and give them. Weights float16 cannot hold are
refused by name instead of being written as infinities.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import onnx
from onnx import numpy_helper

from registry.errors import ZooError

FP32, FP16, BF16 = "fp32", "fp16", "bf16"
DTYPES = (FP32, FP16, BF16)
HALF_QUANTIZE = ("int4",)  # the --quantize choices float16 activations go with: q4f16
FP16_MAX = float(np.finfo(np.float16).max)  # 65504
FLOAT = onnx.TensorProto.FLOAT
CONTRIB = "com.microsoft"
# Ops whose outputs depend on their inputs' shapes only: positions built from Shape are
# still positions.
SHAPE_OPS = ("Shape", "Size")
NORM_CHAIN = ("Add", "Sqrt", "Reciprocal", "Div", "Mul")


class PrecisionError(ZooError):
    """A --dtype that no kernel runs, or weights float16 cannot hold."""


def check_dtype(dtype: str, provider: str) -> None:
    """Refuse what cannot be exported before any work; bf16 names the provider it would need."""
    if dtype not in DTYPES:
        raise PrecisionError(f"--dtype {dtype}: expected one of {', '.join(DTYPES)}")
    if dtype == BF16:
        raise PrecisionError(
            f"--dtype bf16: ONNX Runtime's {provider.upper()} provider (the parity check's, "
            "--provider) has no bfloat16 MatMul kernel to run it; use --dtype fp16")


@dataclass
class Float16Plan:
    """Which nodes of one graph stay float32, and why (for the manifest)."""

    positions_and_masks: list[str]
    softmax: list[str]
    norms: list[str]

    @property
    def nodes(self) -> list[str]:
        return [*self.positions_and_masks, *self.softmax, *self.norms]

    def counts(self) -> dict[str, int]:
        return {"positions_and_masks": len(self.positions_and_masks),
                "softmax": len(self.softmax), "norms": len(self.norms)}


def _name_nodes(graph: onnx.GraphProto) -> None:
    """Give every node a unique name: the converter's block list is by name."""
    seen: set[str] = set()
    for index, node in enumerate(graph.node):
        if not node.name or node.name in seen:
            node.name = f"{node.op_type}_{index}"
        seen.add(node.name)


def _position_nodes(graph: onnx.GraphProto, consumers: dict[str, list[onnx.NodeProto]]
                    ) -> list[str]:
    """Nodes computed from the position ids, the masks and shapes (the integer inputs other
    than token ids) without the activations (tokens, float inputs); and the constants that
    feed those nodes alone. Constants that feed weights (a bias times a scale) are weights."""
    data = {value.name for value in graph.input
            if value.type.tensor_type.elem_type != onnx.TensorProto.INT64
            or value.name.endswith("input_ids")}
    positional = {value.name for value in graph.input if value.name not in data}
    for node in graph.node:  # nodes are in topological order
        if node.op_type in SHAPE_OPS:
            positional.update(node.output)
        elif any(name in data for name in node.input):
            data.update(node.output)
        elif any(name in positional for name in node.input):
            positional.update(node.output)
    kept = {node.name for node in graph.node if node.op_type not in SHAPE_OPS
            and any(output in positional for output in node.output)}
    for node in reversed(graph.node):  # constants whose every reader is kept
        readers = [reader for output in node.output for reader in consumers.get(output, [])]
        if (not any(output in data or output in positional for output in node.output)
                and readers and all(reader.name in kept for reader in readers)):
            kept.add(node.name)
    return [node.name for node in graph.node if node.name in kept]


def _norm_islands(graph: onnx.GraphProto, producers: dict[str, onnx.NodeProto],
                  consumers: dict[str, list[onnx.NodeProto]]) -> list[str]:
    """An RMS norm's square, mean, + eps, square root and division: ReduceMean over Pow(x, 2)
    (or x * x), followed down its single chain to the Div or Mul that applies it to x."""
    kept: list[str] = []
    for node in graph.node:
        square = producers.get(node.input[0]) if node.op_type == "ReduceMean" else None
        if square is None or square.op_type not in ("Pow", "Mul"):
            continue
        chain, value = [square.name, node.name], node.output[0]
        while len(consumers.get(value, [])) == 1:
            step = consumers[value][0]
            if step.op_type not in NORM_CHAIN:
                break
            chain.append(step.name)
            value = step.output[0]
            if step.op_type in ("Div", "Mul") and square.input[0] in step.input:
                break
        kept += chain
    return kept


def float16_plan(graph: onnx.GraphProto) -> Float16Plan:
    _name_nodes(graph)
    producers = {output: node for node in graph.node for output in node.output}
    consumers: dict[str, list[onnx.NodeProto]] = {}
    for node in graph.node:
        for name in node.input:
            consumers.setdefault(name, []).append(node)
    structural = _position_nodes(graph, consumers)
    softmax = []
    for node in graph.node:
        if node.op_type == "Softmax":
            scores = producers.get(node.input[0])
            softmax += [scores.name] if scores is not None and scores.op_type == "Add" else []
            softmax.append(node.name)
    return Float16Plan(structural, softmax, _norm_islands(graph, producers, consumers))


def _refuse_beyond_float16(where: str, name: str, largest: float) -> None:
    if not largest <= FP16_MAX:  # NaN too
        raise PrecisionError(f"{where}: --dtype fp16: weight {name} holds {largest:.4g}, beyond "
                             f"float16's largest finite value {FP16_MAX:g}; export it as fp32")


def check_weights_fit(model: Any, where: str) -> None:
    """Before any tracing: refuse, by its PyTorch name, a weight float16 cannot hold (the
    graphs rename the weights they transpose; the graph check below stays as a backstop)."""
    for name, tensor in model.state_dict().items():
        if tensor.is_floating_point() and tensor.numel() > 1:
            _refuse_beyond_float16(where, name, float(tensor.detach().abs().max()))


def _check_representable(graph: onnx.GraphProto, kept: set[str], file: str) -> None:
    """Refuse a weight (an initializer of more than one element) read by a float16 node that
    float16 cannot hold; scalar constants (a mask's lowest value) are clamped."""
    converted_inputs = {name for node in graph.node if node.name not in kept
                        for name in node.input}
    for tensor in graph.initializer:
        if tensor.data_type != FLOAT or tensor.name not in converted_inputs:
            continue
        values = numpy_helper.to_array(tensor)
        if values.size <= 1:
            continue
        _refuse_beyond_float16(file, tensor.name, float(np.abs(values).max()))


def _float_values(model: onnx.ModelProto) -> set[str]:
    """The names of the graph's float32 values, typed by onnx's shape inference. It leaves the
    outputs of ONNX Runtime's contrib operators (MatMulNBits, GroupQueryAttention, the fused
    norms and MoE: float outputs, all of them) untyped, and so whatever reads them: those are
    typed float and the inference runs once more. (ONNX Runtime's symbolic inference knows the
    contrib operators, but where it gives up it writes a model into the working folder.)"""
    typed = onnx.shape_inference.infer_shapes(model)
    untyped = [output for node in typed.graph.node if node.domain == CONTRIB
               for output in node.output if output and not _types(typed.graph).get(output)]
    if untyped:
        typed.graph.value_info.extend(onnx.helper.make_tensor_value_info(name, FLOAT, None)
                                      for name in untyped)
        typed = onnx.shape_inference.infer_shapes(typed)
    return {name for name, element in _types(typed.graph).items() if element == FLOAT}


def _types(graph: onnx.GraphProto) -> dict[str, int]:
    """{value: element type} of what the graph declares and the inference typed."""
    types = {value.name: value.type.tensor_type.elem_type
             for value in [*graph.input, *graph.output, *graph.value_info]}
    types.update({tensor.name: tensor.data_type for tensor in graph.initializer})
    return types


def _half_tensor(tensor: onnx.TensorProto) -> onnx.TensorProto:
    values = np.clip(numpy_helper.to_array(tensor), -FP16_MAX, FP16_MAX)
    return numpy_helper.from_array(values.astype(np.float16), tensor.name)


def _half_attributes(node: onnx.NodeProto) -> None:
    """A float16 node's own float32: Cast's target, Constant's and ConstantOfShape's value."""
    for attribute in node.attribute:
        if node.op_type == "Cast" and attribute.name == "to" and attribute.i == FLOAT:
            attribute.i = onnx.TensorProto.FLOAT16
        elif attribute.type == onnx.AttributeProto.TENSOR and attribute.t.data_type == FLOAT:
            attribute.t.CopyFrom(_half_tensor(attribute.t))
        elif attribute.type == onnx.AttributeProto.GRAPH:
            raise PrecisionError(f"--dtype fp16: {node.op_type} {node.name} holds a subgraph, "
                                 "which the conversion does not enter")


def _convert(model: onnx.ModelProto, kept: set[str]) -> None:
    """In place: every float32 value float16 except the outputs of `kept` nodes, with one Cast
    per value and dtype where a value meets a reader of the other dtype."""
    floats = _float_values(model)
    graph = model.graph
    wide = {output for node in graph.node if node.name in kept for output in node.output
            if output in floats}
    casts: dict[tuple[str, bool], str] = {}
    cast_nodes: list[onnx.NodeProto] = []

    def as_dtype(value: str, want_wide: bool) -> str:
        if value not in floats or (value in wide) == want_wide:
            return value
        key = (value, want_wide)
        if key not in casts:
            casts[key] = f"{value}/as_{'fp32' if want_wide else 'fp16'}"
            target = FLOAT if want_wide else onnx.TensorProto.FLOAT16
            cast_nodes.append(onnx.helper.make_node("Cast", [value], [casts[key]], to=target,
                                                    name=casts[key]))
        return casts[key]

    readers: dict[str, set[bool]] = {}
    for node in graph.node:
        for name in node.input:
            readers.setdefault(name, set()).add(node.name in kept)
    for tensor in graph.initializer:  # wide where only wide nodes read it
        if tensor.data_type == FLOAT and readers.get(tensor.name) == {True}:
            wide.add(tensor.name)
    producer = {output: index for index, node in enumerate(graph.node)
                for output in node.output}
    for node in graph.node:
        keep = node.name in kept
        if not keep:
            _half_attributes(node)
        for index, name in enumerate(node.input):
            if name:
                node.input[index] = as_dtype(name, keep)
    after: dict[int, list[onnx.NodeProto]] = {}
    for cast in cast_nodes:  # each right after what it casts: the order stays topological
        after.setdefault(producer.get(cast.input[0], -1), []).append(cast)
    ordered = [*after.get(-1, []), *[placed for index, node in enumerate(graph.node)
                                     for placed in (node, *after.get(index, []))]]
    del graph.node[:]
    graph.node.extend(ordered)
    for index, tensor in enumerate(graph.initializer):
        if tensor.data_type == FLOAT and tensor.name not in wide:
            graph.initializer[index].CopyFrom(_half_tensor(tensor))
    for value in [*graph.input, *graph.output]:
        if value.type.tensor_type.elem_type == FLOAT:
            value.type.tensor_type.elem_type = onnx.TensorProto.FLOAT16
    for output in graph.output:  # a graph output a wide node makes: cast under its name
        if output.name in wide:
            _rename_output(graph, output.name)
    del graph.value_info[:]  # stale types; ONNX Runtime infers its own


def _rename_output(graph: onnx.GraphProto, name: str) -> None:
    inner = f"{name}/fp32"
    for node in graph.node:
        node.output[:] = [inner if output == name else output for output in node.output]
        node.input[:] = [inner if value == name else value for value in node.input]
    graph.node.append(onnx.helper.make_node("Cast", [inner], [name], to=onnx.TensorProto.FLOAT16,
                                            name=f"{name}/as_output"))


def to_float16(model: onnx.ModelProto, file: str) -> tuple[onnx.ModelProto, Float16Plan]:
    """The float16 model (converted in place) and its plan; weights float16 cannot hold are
    refused first."""
    plan = float16_plan(model.graph)
    kept = set(plan.nodes)
    _check_representable(model.graph, kept, file)
    _convert(model, kept)
    return model, plan
