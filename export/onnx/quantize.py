"""Weight-only quantization of exported graphs with ONNX Runtime's MatMulNBits quantizer.

Every MatMul with a constant weight becomes MatMulNBits (int8 or int4 blocks of 32 along the
input dimension, one fp32 scale per block, symmetric); inputs and outputs stay fp32, so this is
weight-only, for int8 too (quantize_dynamic would quantize every activation tensor as well).
A tied LM head arrives as MatMul(x, Transpose(embedding)); the Transpose is folded into a
transposed initializer first, so the head (the largest matrix of a GPT-2) is quantized too,
while the embedding Gather keeps the fp32 table. The experts of --optimize's MoE node, 3-D
weights no MatMul reads, are quantized alike into ONNX Runtime's QMoE (quantize_experts.py).
"""

from __future__ import annotations

import logging

import numpy as np
import onnx
from onnx import numpy_helper

from export.logs import quiet_loggers
from export.onnx.forms import drop_unused_initializers
from export.onnx.optimize import ensure_ms_opset
from export.onnx.quantize_experts import quantize_experts
from registry.errors import ZooError, first_line

BITS = {"int8": 8, "int4": 4}
DYNAMIC = "int8-dynamic"  # export/onnx/dynamic.py: int8 weights and activations, for encoders
GGUF = "gguf"  # export/onnx/gguf_export.py: an imported GGUF file's own blocks
CHOICES = (*BITS, DYNAMIC, GGUF)
BLOCK_SIZE = 32
# accuracy_level 4: MatMulNBits quantizes activation blocks to int8 inside its dot products
# (VNNI on x86). Measured on gpt2-small (decode step at past 256): int8 5.2 ms at level 4
# against 82 ms at level 0 (fp32 dot products); top-1 agreement 61 against 62 of 64 tokens.
ACCURACY_LEVEL = 4
# q4f16 (--quantize int4 --dtype fp16): level 0, each provider's own compute type. With 4, ONNX
# Runtime 1.31's CPU provider computes a float16 MatMulNBits with int8 activations in a graph
# but in float16 inside an If (the seq2seq layout's merged decoder): measured 0.33 apart in a
# tiny decoder's cache; at levels 0 to 2 both places run one kernel, bit for bit.
HALF_ACCURACY_LEVEL = 0


class QuantizeError(ZooError):
    """An unknown --quantize choice, or the quantizer refused a graph."""


def check_choice(choice: str) -> None:
    if choice not in CHOICES:
        raise QuantizeError(f"--quantize {choice}: expected one of {', '.join(CHOICES)}")


def fold_transposed_weights(model: onnx.ModelProto) -> int:
    """Replace MatMul(x, Transpose(W)) by MatMul(x, W_T) for initializers W; returns how many."""
    graph = model.graph
    initializers = {tensor.name: tensor for tensor in graph.initializer}
    consumers: dict[str, int] = {}
    for node in graph.node:
        for name in node.input:
            consumers[name] = consumers.get(name, 0) + 1
    transposes = {node.output[0]: node for node in graph.node
                  if node.op_type == "Transpose" and node.input[0] in initializers
                  and len(initializers[node.input[0]].dims) == 2}
    folded = 0
    for node in list(graph.node):
        if node.op_type != "MatMul" or node.input[1] not in transposes:
            continue
        transpose = transposes[node.input[1]]
        weight = numpy_helper.to_array(initializers[transpose.input[0]])
        name = f"{transpose.input[0]}.T"
        if name not in initializers:
            initializers[name] = numpy_helper.from_array(np.ascontiguousarray(weight.T), name)
            graph.initializer.append(initializers[name])
        node.input[1] = name
        folded += 1
        consumers[transpose.output[0]] -= 1
        if consumers[transpose.output[0]] == 0:
            graph.node.remove(transpose)
    return folded


def quantize(model: onnx.ModelProto, choice: str, accuracy_level: int = ACCURACY_LEVEL
             ) -> tuple[onnx.ModelProto, int]:
    """The quantized model and the number of MatMuls it quantized."""
    from onnxruntime.quantization.matmul_nbits_quantizer import MatMulNBitsQuantizer

    check_choice(choice)
    bits = BITS[choice]
    fold_transposed_weights(model)
    with quiet_loggers("onnxruntime", "onnxruntime.quantization", disable=logging.WARNING):
        try:
            quantizer = MatMulNBitsQuantizer(model, bits=bits, block_size=BLOCK_SIZE,
                                             is_symmetric=True, accuracy_level=accuracy_level,
                                             op_types_to_quantize=("MatMul",))
            quantizer.process()
        except Exception as exc:  # the quantizer raises many types; report one line
            raise QuantizeError(f"--quantize {choice}: {first_line(exc)}") from exc
    quantized = quantizer.model.model
    ensure_ms_opset(quantized)
    count = sum(node.op_type == "MatMulNBits" for node in quantized.graph.node)
    quantize_experts(quantized, bits, accuracy_level)  # the MoE node's 3-D weights: QMoE
    drop_unused_initializers(quantized.graph)
    return quantized, count
