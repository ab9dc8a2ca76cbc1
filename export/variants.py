"""`zoo export --optimize` and `--quantize`: what they add to the contract graphs before the
files are written.

--optimize: decoders also get model_kv.onnx (the shared-cache generation graph, see
kv_graph.py); every graph gets ONNX Runtime's transformer fusions. --quantize int8|int4: every
graph's constant MatMul weights become MatMulNBits blocks. The contract graphs keep their input
and output names either way, so the parity grid (or, quantized, the agreement check) runs on
them unchanged.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import onnx
import torch
from torch import nn

from export.kv_graph import KV_FILE, kv_names, kv_trace, shared_cache_attention
from export.onnx_export import Variant, _export_one
from export.onnx_files import set_metadata, strip_debug
from export.optimize import FusionReport, fuse
from export.quantize import ACCURACY_LEVEL, BLOCK_SIZE, check_choice, quantize
from registry.catalog import Card


def export_kv_graph(model: nn.Module, card: Card, opset: int, metadata: dict[str, str]
                    ) -> onnx.ModelProto:
    graph, args, shapes = kv_trace(model, card)
    with torch.no_grad(), shared_cache_attention(model):
        proto = _export_one(graph, args, shapes, kv_names(card["n_layers"]), opset,
                            Path(KV_FILE))
    strip_debug(proto)
    set_metadata(proto, metadata)
    return proto


def apply_variant(protos: dict[str, onnx.ModelProto], model: nn.Module, card: Card,
                  opset: int, variant: Variant, metadata: dict[str, str],
                  progress: Callable[[str], None]) -> None:
    """Change `protos` in place (and add files); record what was done in `variant`."""
    if variant.quantize:
        check_choice(variant.quantize)  # before minutes of work
    if variant.optimize:
        if card.family == "decoder":
            progress(f"exporting {KV_FILE} (key/value cache updated in place)...")
            protos[KV_FILE] = export_kv_graph(model, card, opset, metadata)
            variant.manifest["generation"] = {
                "file": KV_FILE,
                "attention": "com.microsoft.GroupQueryAttention",
                "inputs": kv_names(card["n_layers"])[0],
                "outputs": kv_names(card["n_layers"])[1],
                "cache": "(batch, n_heads, capacity, head_dim) buffers; bind each present.* "
                         "output to its past_key_values.* input",
            }
        progress("fusing (onnxruntime.transformers.optimizer)...")
        report = FusionReport()
        for file in list(protos):
            protos[file] = fuse(protos[file], card, file, report)
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
