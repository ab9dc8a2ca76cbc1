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
"""

from __future__ import annotations

import onnx

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


def fast_forms(model: onnx.ModelProto) -> onnx.ModelProto:
    """Every rewrite above, in place; returns the model."""
    residual_sums(model)
    return model
