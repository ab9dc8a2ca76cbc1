"""--quantize int8-dynamic: ONNX Runtime's dynamic quantization of the MatMuls with constant
weights, for the graphs whose work is compute-bound (an encoder's forward).

Weights are stored as int8 (signed, symmetric); each MatMul's activation is quantized to uint8
when the graph runs (DynamicQuantizeLinear) and multiplied in integers (MatMulInteger), which
ONNX Runtime fuses at load time into DynamicQuantizeMatMul / MatMulIntegerToFloat with the
bias. Products between activations (Q·Kᵀ, the attention-weighted values) stay fp32.

`reduce_range` (7-bit weights) where the CPU has no VNNI: AVX2's u8 x s8 dot product sums pairs
into 16 bits, which saturates with full-range weights. A tied head's MatMul(x, Transpose(E)) is
folded into a transposed weight first, as for the weight-only modes, so it is quantized too.

The first layer's feed-forward output projection stays fp32: its input carries the outlier
activations BERT-style encoders are known for, and DynamicQuantizeLinear gives a whole
activation tensor one uint8 scale. Measured on all-MiniLM-L6-v2 over 50 lines of the shipped
text in one batch: every MatMul quantized, the worst line's cosine to fp32 was 0.964 (mean
0.989; Optimum's int8 0.971, 0.987); that one MatMul kept fp32, 0.974 (0.991), where keeping
another layer's feed-forward output gained at most 0.004.
"""

from __future__ import annotations

import logging
import tempfile
from dataclasses import dataclass
from pathlib import Path

import onnx

from export.cpu import has_vnni
from export.logs import quiet_loggers
from export.onnx.forms import drop_unused_initializers
from export.onnx.quantize import DYNAMIC, QuantizeError, fold_transposed_weights
from registry.errors import first_line

QUANTIZED_OPS = ("MatMulInteger", "DynamicQuantizeLinear")


@dataclass(frozen=True)
class DynamicSettings:
    """How the weights are quantized; recorded in the manifest."""

    per_channel: bool
    reduce_range: bool

    @classmethod
    def for_this_cpu(cls) -> DynamicSettings:
        # Per-channel: one scale per output column. On bert-base's shape (random weights) it
        # kept MLM top-1 at 94.5% against per-tensor's 91.9%, and all-MiniLM-L6-v2's worst
        # line at 0.977 against 0.749, at no measurable cost in speed on this loaded machine.
        return cls(per_channel=True, reduce_range=not has_vnni())

    def as_dict(self) -> dict[str, object]:
        return {"per_channel": self.per_channel, "reduce_range": self.reduce_range,
                "weight_format": "int8 symmetric", "activations": "uint8, quantized at run time"}


def first_feed_forward_output(model: onnx.ModelProto, d_model: int, d_ff: int) -> list[str]:
    """The name of the first MatMul (in graph order) whose constant weight is d_ff x d_model:
    the first layer's feed-forward output projection; none where no MatMul has that shape."""
    shapes = {tensor.name: tuple(tensor.dims) for tensor in model.graph.initializer}
    for node in model.graph.node:
        if node.op_type == "MatMul" and shapes.get(node.input[1]) == (d_ff, d_model):
            return [node.name]
    return []


def quantize_dynamic_graph(model: onnx.ModelProto, settings: DynamicSettings,
                           d_model: int, d_ff: int) -> tuple[onnx.ModelProto, int]:
    """The quantized model and the number of MatMuls it quantized."""
    from onnxruntime.quantization import QuantType, quantize_dynamic

    fold_transposed_weights(model)
    kept = first_feed_forward_output(model, d_model, d_ff)
    with tempfile.TemporaryDirectory() as scratch, quiet_loggers(
            "onnxruntime", "onnxruntime.quantization", disable=logging.WARNING):
        path = Path(scratch) / "quantized.onnx"
        try:
            quantize_dynamic(model, path, op_types_to_quantize=["MatMul"],
                             per_channel=settings.per_channel,
                             reduce_range=settings.reduce_range, weight_type=QuantType.QInt8,
                             nodes_to_exclude=kept, extra_options={"MatMulConstBOnly": True})
        except Exception as exc:  # the quantizer raises many types; report one line
            raise QuantizeError(f"--quantize {DYNAMIC}: {first_line(exc)}") from exc
        quantized = onnx.load(str(path))
    drop_unused_initializers(quantized.graph)
    count = sum(node.op_type == "MatMulInteger" for node in quantized.graph.node)
    return quantized, count
