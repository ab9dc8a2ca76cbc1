"""Rewrites of a traced graph into the forms a plain ONNX Runtime session runs fastest, in the
default ONNX domain (the contract: any runtime still reads it, and the results are the same).

Most forms come from how the PyTorch blocks are written (zoo/blocks: the score scale on Q,
one additive mask, GELU in the order ORT's GeluFusion matches). What torch.onnx's exporter
writes in one fixed way is changed here, on the proto.

The residual sum before a LayerNormalization becomes `Sum` instead of `Add`. ONNX Runtime
fuses Add + LayerNormalization into its SkipLayerNormalization when it loads a graph in which
both Add inputs have the same known shape (the dynamo exporter's graphs always do), and that
CPU kernel was measured 4 to 20 times slower than the Add and LayerNormalization it replaces
(24 of them at 1 x 128 x 768: 53 ms against 2.6 ms, load ~6; bert-base on the project's
AVX-512 machine: 7.2 ms against 1.8 ms). No fusion matches Sum, whose kernel costs what Add
costs. Sum of two same-shape tensors is Add, element for element.

Projections of one tensor (attention's query, key and value; SwiGLU's gate and up) become one
MatMul on their weights side by side, one bias Add and a Split. Same FLOPs, a third of the
kernel calls: a 768 x 2304 product over 32 rows ran in about 0.7x the time of three 768 x 768
ones here (2-core AVX2), which is most of what a short GPT-2 prefill lost to Optimum's graph
(GPT-2's own checkpoint stores Q, K and V as one matrix). Every output column is the same dot
product as before, so the results are bit for bit the same. The weights are stored joined;
the biases stay as they were (equal ones, such as the zeros of a fresh model, share one
tensor) and are joined by a Concat that ONNX Runtime folds into a constant at load.
"""

from __future__ import annotations

from collections import defaultdict

import numpy as np
import onnx
from onnx import helper, numpy_helper

from export.onnx.weights import INLINE, InlineWeights

NORMS = {"LayerNormalization"}


def _constants(graph: onnx.GraphProto) -> set[str]:
    names = {tensor.name for tensor in graph.initializer}
    names.update(out for node in graph.node if node.op_type == "Constant" for out in node.output)
    return names


def residual_sums(model: onnx.ModelProto) -> int:
    """Turn each Add of two computed tensors that feeds a norm's input into Sum, in place;
    returns how many. A bias Add (one constant input) is left alone."""
    graph = model.graph
    feeds_norm = {node.input[0] for node in graph.node if node.op_type in NORMS and node.input}
    constants = _constants(graph)
    changed = 0
    for node in graph.node:
        if (node.op_type == "Add" and node.domain in ("", "ai.onnx")
                and node.output[0] in feeds_norm
                and not any(name in constants for name in node.input)):
            node.op_type = "Sum"
            changed += 1
    return changed


def _weight(initializers: dict[str, onnx.TensorProto], name: str, rank: int
            ) -> onnx.TensorProto | None:
    tensor = initializers.get(name)
    return tensor if tensor is not None and len(tensor.dims) == rank else None


def _projection(initializers: dict[str, onnx.TensorProto], matmul: onnx.NodeProto,
                consumers: dict[str, list[onnx.NodeProto]]) -> tuple | None:
    """(weight, bias Add or None, bias name or None) when `matmul` is x @ W with W a 2-D
    initializer, the bias Add being its only consumer with a 1-D initializer as the other
    input. Shapes only: the values are read when a group is joined (a big model's are on
    disk, read one group at a time)."""
    weight = _weight(initializers, matmul.input[1], 2)
    if weight is None or matmul.domain not in ("", "ai.onnx"):
        return None
    users = consumers[matmul.output[0]]
    if len(users) == 1 and users[0].op_type == "Add" and users[0].domain in ("", "ai.onnx"):
        add = users[0]
        other = add.input[1] if add.input[0] == matmul.output[0] else add.input[0]
        bias = _weight(initializers, other, 1)
        if bias is not None and bias.dims[0] == weight.dims[1]:
            return weight, add, other
    return weight, None, None


def fused_projections(model: onnx.ModelProto, weights: InlineWeights = INLINE) -> int:
    """Merge MatMuls of one input by constant weights of one dtype and input width (all with a
    bias Add or all without) into one MatMul + Add + Split, in place; returns how many MatMuls
    were merged away."""
    graph = model.graph
    initializers = {tensor.name: tensor for tensor in graph.initializer}
    consumers: dict[str, list[onnx.NodeProto]] = defaultdict(list)
    for node in graph.node:
        for name in node.input:
            consumers[name].append(node)
    groups: dict[tuple, list[tuple]] = defaultdict(list)
    for node in graph.node:
        if node.op_type == "MatMul" and (found := _projection(initializers, node, consumers)):
            weight, add, _ = found
            key = (node.input[0], weight.dims[0], weight.data_type, add is not None)
            groups[key].append((node, *found))
    merged = 0
    for key, members in groups.items():
        if len(members) < 2:
            continue
        first = list(graph.node).index(members[0][0])
        name = members[0][0].output[0] + "_fused"
        joined = np.concatenate([weights.values(weight) for _, weight, _, _ in members], axis=1)
        graph.initializer.append(weights.add(joined, name + "_weight"))
        del joined
        widths = np.array([weight.dims[1] for _, weight, _, _ in members], np.int64)
        graph.initializer.append(numpy_helper.from_array(widths, name + "_widths"))
        outputs = [(add or node).output[0] for node, _, add, _ in members]
        nodes = [helper.make_node("MatMul", [key[0], name + "_weight"], [name])]
        if key[3]:  # a Concat of constants, which the session folds when it loads the graph
            biases = [bias for *_, bias in members]
            nodes.append(helper.make_node("Concat", biases, [name + "_bias"], axis=0))
            nodes.append(helper.make_node("Add", [name, name + "_bias"], [name + "_biased"]))
        nodes.append(helper.make_node("Split", [nodes[-1].output[0], name + "_widths"],
                                      outputs, axis=-1))
        for node, _, add, _ in members:
            graph.node.remove(node)
            if add is not None:
                graph.node.remove(add)
        for offset, node in enumerate(nodes):
            graph.node.insert(first + offset, node)
        merged += len(members) - 1
    if merged:
        _drop_unused(graph)
    return merged


def _names_used(graph: onnx.GraphProto) -> set[str]:
    """Every tensor name a node reads, in subgraphs too, and the graph's outputs."""
    used = {output.name for output in graph.output}
    for node in graph.node:
        used.update(node.input)
        for attribute in node.attribute:
            subgraphs = [attribute.g] if attribute.HasField("g") else []
            for subgraph in [*subgraphs, *attribute.graphs]:
                used |= _names_used(subgraph)
    return used


def drop_unused_initializers(graph: onnx.GraphProto) -> None:
    """Initializers nobody reads any more (a rewrite or the quantizer replaced their reader)."""
    used = _names_used(graph)
    kept = [tensor for tensor in graph.initializer if tensor.name in used]
    del graph.initializer[:]
    graph.initializer.extend(kept)


def _drop_unused(graph: onnx.GraphProto) -> None:
    """Initializers nobody reads any more, and the value_info of tensors no node writes."""
    drop_unused_initializers(graph)
    written = {name for node in graph.node for name in node.output}
    info = [entry for entry in graph.value_info if entry.name in written]
    del graph.value_info[:]
    graph.value_info.extend(info)


def tied_transposes(model: onnx.ModelProto, weights: InlineWeights = INLINE) -> int:
    """A tied head's weight stored once: where the exporter folded Transpose(E) of an embedding
    E (an initializer read by Gather) into a constant for the head's MatMul (the encoder-
    decoder's decoder graph; a T5's head was a second copy of its largest matrix), the MatMul
    reads Transpose(E) again, as in the decoder family's graph. ONNX Runtime folds that
    Transpose in memory when it loads the graph, and the quantizers fold it into the weight
    they quantize (quantize.py: fold_transposed_weights). Returns how many were restored."""
    graph = model.graph
    initializers = {tensor.name: tensor for tensor in graph.initializer}
    tables = {node.input[0] for node in graph.node if node.op_type == "Gather"
              and node.input[0] in initializers and len(initializers[node.input[0]].dims) == 2}
    restored = 0
    for node in list(graph.node):
        constant = initializers.get(node.input[1]) if node.op_type == "MatMul" else None
        if constant is None or len(constant.dims) != 2:
            continue
        table = next((name for name in sorted(tables)  # shapes first: values are read
                      if list(initializers[name].dims)[::-1] == list(constant.dims)
                      and np.array_equal(weights.values(initializers[name]).T,
                                         weights.values(constant))), None)
        if table is None:
            continue
        node.input[1] = f"{table}_transposed"
        if not any(f"{table}_transposed" in other.output for other in graph.node):
            graph.node.insert(0, helper.make_node("Transpose", [table],
                                                  [f"{table}_transposed"], perm=[1, 0]))
        restored += 1
    if restored:
        _drop_unused(graph)
    return restored


def fast_forms(model: onnx.ModelProto, weights: InlineWeights = INLINE) -> onnx.ModelProto:
    """Every rewrite above, in place; returns the model."""
    residual_sums(model)
    fused_projections(model, weights)
    tied_transposes(model, weights)
    return model
