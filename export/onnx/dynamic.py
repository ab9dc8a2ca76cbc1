"""--quantize int8-dynamic: ONNX Runtime's dynamic quantization of the MatMuls with constant
weights, for the graphs whose work is compute-bound (an encoder's forward).

Weights are stored as int8 (signed, symmetric, per output column); each MatMul's activation is
quantized to uint8 when the graph runs (DynamicQuantizeLinear) and multiplied in integers
(MatMulInteger), which ONNX Runtime fuses at load time into DynamicQuantizeMatMul. Products
between activations (Q·Kᵀ, the attention-weighted values) stay fp32.

DynamicQuantizeLinear gives a whole activation tensor one scale, which BERT-style encoders'
outlier channels and tokens make coarse: smoothing.py rewrites the graph first (smoothing of
the MatMuls reading a LayerNormalization, per-token scales on the feed-forward output
projection's input), calibrated on `calibration` feeds. Every MatMul with a weight is then
quantized: the first layer's feed-forward output, kept fp32 before the rewrites for its
outliers, now gains nothing from it (all-MiniLM-L6-v2's worst line 0.9952 quantized, 0.9944
kept) and would cost a fp32 MatMul.

`reduce_range` (7-bit weights) where the CPU has no VNNI: AVX2's u8 x s8 dot product sums pairs
into 16 bits, which saturates with full-range weights. A tied head's MatMul(x, Transpose(E)) is
folded into a transposed weight first, as for the weight-only modes, so it is quantized too.
"""

from __future__ import annotations

import logging
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx

from export.cpu import has_vnni
from export.logs import quiet_loggers
from export.onnx.forms import drop_unused_initializers
from export.onnx.quantize import DYNAMIC, QuantizeError, fold_transposed_weights
from export.onnx.smoothing import SmoothingReport, prepare_for_int8
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


def quantize_dynamic_graph(model: onnx.ModelProto, settings: DynamicSettings, d_model: int,
                           d_ff: int, calibration: dict[str, np.ndarray]
                           ) -> tuple[onnx.ModelProto, int, SmoothingReport]:
    """The quantized model, the number of MatMuls it quantized, and what smoothing did."""
    from onnxruntime.quantization import QuantType, quantize_dynamic

    fold_transposed_weights(model)
    try:  # the calibration probe runs the fp32 graph in ONNX Runtime
        report = prepare_for_int8(model, calibration, d_model, d_ff,
                                  weight_levels=64 if settings.reduce_range else 127)
    except Exception as exc:  # ORT's own exception types; report one line
        raise QuantizeError(f"--quantize {DYNAMIC}: calibration: {first_line(exc)}") from exc
    with tempfile.TemporaryDirectory() as scratch, quiet_loggers(
            "onnxruntime", "onnxruntime.quantization", disable=logging.WARNING):
        path = Path(scratch) / "quantized.onnx"
        try:
            quantize_dynamic(model, path, op_types_to_quantize=["MatMul"],
                             per_channel=settings.per_channel,
                             reduce_range=settings.reduce_range, weight_type=QuantType.QInt8,
                             extra_options={"MatMulConstBOnly": True})
        except Exception as exc:  # the quantizer raises many types; report one line
            raise QuantizeError(f"--quantize {DYNAMIC}: {first_line(exc)}") from exc
        quantized = onnx.load(str(path))
    drop_unused_initializers(quantized.graph)
    count = sum(node.op_type == "MatMulInteger" for node in quantized.graph.node)
    return quantized, count, report
