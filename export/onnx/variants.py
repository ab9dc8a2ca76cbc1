"""`zoo export --optimize` and `--quantize`: what they add to the contract graphs before the
files are written.

--optimize: a family may add graphs (decoders: model_kv.onnx, the shared-cache generation
graph, see shared_cache.py); every graph gets ONNX Runtime's transformer fusions.
--quantize int8|int4: every graph's constant MatMul weights become MatMulNBits blocks. The
contract graphs keep their input and output names either way, so the parity grid (or,
quantized, the agreement check) runs on them unchanged.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import onnx
from torch import nn

from export.families import family_of
from export.onnx.optimize import FusionReport, fuse
from export.onnx.quantize import ACCURACY_LEVEL, BLOCK_SIZE, quantize
from registry.catalog import Card


@dataclass
class Variant:
    """What `zoo export --optimize / --quantize` adds to the plain export. The export fills
    `notes` (fused-operator counts, missing fusions, quantized MatMuls) and `manifest` (extra
    manifest.json entries) for the caller to print and check."""

    optimize: bool = False
    quantize: str | None = None  # "int8" | "int4"
    attentions: bool = False  # the contract graphs also output every layer's attention maps
    notes: list[str] = field(default_factory=list)
    manifest: dict[str, Any] = field(default_factory=dict)

    @property
    def plain(self) -> bool:
        return not self.optimize and not self.quantize



def apply_variant(protos: dict[str, onnx.ModelProto], model: nn.Module, card: Card,
                  opset: int, variant: Variant, metadata: dict[str, str],
                  progress: Callable[[str], None]) -> None:
    """Change `protos` in place (and add files); record what was done in `variant`."""
    if variant.optimize:
        family = family_of(card)
        extras = family.optimized_extras(model, card, opset, metadata, progress)
        protos.update(extras.graphs)
        variant.manifest.update(extras.manifest)
        progress("fusing (onnxruntime.transformers.optimizer)...")
        report = FusionReport()
        for file in list(protos):
            protos[file] = fuse(protos[file], card, file, report, family.optimizer_model_type,
                                family.attention_fusion_note)
        variant.notes.extend(report.lines())
        variant.manifest["optimization"] = report.as_dict()
    if variant.quantize:
        progress(f"quantizing MatMul weights to {variant.quantize} (MatMulNBits)...")
        counts = {}
        for file in list(protos):
            protos[file], counts[file] = quantize(protos[file], variant.quantize)
            variant.notes.append(f"quantized {counts[file]} MatMul weights in {file} to "
                                 f"{variant.quantize}")
        variant.manifest["quantization"] = {
            "weights": variant.quantize,
            "activations": "fp32 in and out (weight-only); accuracy_level 4 lets MatMulNBits "
                           "quantize activation blocks to int8 inside its dot products",
            "accuracy_level": ACCURACY_LEVEL,
            "method": "onnxruntime MatMulNBitsQuantizer", "block_size": BLOCK_SIZE,
            "symmetric": True, "matmuls": counts,
            "check": "top-1 agreement with fp32 instead of the parity grid",
        }
