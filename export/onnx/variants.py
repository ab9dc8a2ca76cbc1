"""`zoo export --optimize` and `--quantize`: what they add to the contract graphs before the
files are written.

--optimize: a family may add graphs (decoders: model_kv.onnx, the shared-cache generation
graph, see shared_cache.py); every graph gets ONNX Runtime's transformer fusions.
--quantize int8|int4: every graph's constant MatMul weights become MatMulNBits blocks.
--quantize gguf: the imported GGUF file's own blocks (gguf_export.py).
--quantize int8-dynamic: the family's compute-bound graphs (an encoder's model.onnx, an
encoder-decoder's encoder.onnx) get int8 weights and run-time int8 activations (dynamic.py).
The contract graphs keep their input and output names either way, so the parity grid (or,
quantized, the agreement check or the quality gate) runs on them unchanged. A quantized client
graph (under onnx/) is stored under the name transformers.js opens for its dtype
(`onnx/model_q4.onnx`; runtime/contract.py's quantized_name), recorded in the manifest's
`quantization.stored_as`; nothing is left under the fp32 name. So is each graph of an
encoder-decoder's seq2seq layout that holds quantized operators (`layout_under_dtype_names`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import onnx
from torch import nn

from export.checks.quality import calibration_batch
from export.family import Family
from export.onnx.dynamic import QUANTIZED_OPS, DynamicSettings, quantize_dynamic_graph
from export.onnx.gguf_export import (
    GGUFWeights,
    expert_outcome,
    manifest_entry,
    quantize_gguf,
    type_counts_line,
)
from export.onnx.optimize import FusionReport, fuse
from export.onnx.precision import FP16, to_float16
from export.onnx.quantize import (
    ACCURACY_LEVEL,
    BLOCK_SIZE,
    DYNAMIC,
    GGUF,
    HALF_ACCURACY_LEVEL,
    quantize,
)
from export.onnx.quantize_experts import experts_entry
from export.options import ExportOptions
from registry.catalog import Card
from registry.paths import display_path
from runtime.contract import (
    CLIENT_FOLDER,
    RENAMING_ENTRIES,
    client_dtype_of,
    quantized_name,
)
from runtime.files.tokenizer import Tokenizer, load_tokenizer


@dataclass
class VariantResult:
    """What --optimize / --quantize did: `notes` (fused-operator counts, missing fusions,
    quantized MatMuls) for the caller to print, `manifest` entries for manifest.json."""

    notes: list[str] = field(default_factory=list)
    manifest: dict[str, Any] = field(default_factory=dict)

    @property
    def stored_as(self) -> dict[str, str]:
        """{contract graph: the file a quantized (or float16) one is stored as}: the manifest
        entry's own dict, which the writer adds the layout's renames to; empty when none."""
        for entry in RENAMING_ENTRIES:
            if entry in self.manifest:
                return self.manifest[entry].setdefault("stored_as", {})
        return {}


def apply_variant(protos: dict[str, onnx.ModelProto], model: nn.Module, card: Card,
                  family: Family, options: ExportOptions, metadata: dict[str, str],
                  progress: Callable[[str], None], folder: Path,
                  gguf: GGUFWeights | None = None) -> VariantResult:
    """Change `protos` in place (and add files); say what was done. `folder`: the staged
    export, whose tokenizer (where it has one) reads int8-dynamic's calibration text;
    `gguf`: --quantize gguf's blocks."""
    variant = VariantResult()
    contract_files = list(protos)  # before --optimize adds its own graphs
    if options.optimize:
        extras = family.optimized_extras(model, card, options.opset, metadata, progress)
        protos.update(extras.graphs)
        variant.manifest.update(extras.manifest)
        progress("fusing (onnxruntime.transformers.optimizer)...")
        report = FusionReport()
        for file in list(protos):
            protos[file] = fuse(protos[file], card, file, report, family.optimizer_model_type,
                                family.attention_fusion_note)
        variant.notes.extend(report.lines())
        variant.manifest["optimization"] = report.as_dict()
    if options.quantize == DYNAMIC:
        variant.notes.extend(_quantize_dynamic(protos, card, family, variant, progress,
                                               load_tokenizer(folder), options))
    elif options.quantize == GGUF and gguf is not None:
        _place_gguf_blocks(protos, gguf, variant, progress)
    elif options.quantize:
        progress(f"quantizing MatMul weights to {options.quantize} (MatMulNBits)...")
        counts = {}
        level = HALF_ACCURACY_LEVEL if options.dtype == FP16 else ACCURACY_LEVEL
        for file in list(protos):
            protos[file], counts[file] = quantize(protos[file], options.quantize, level)
            variant.notes.append(f"quantized {counts[file]} MatMul weights in {file} to "
                                 f"{options.quantize}")
        variant.manifest["quantization"] = {
            "weights": options.quantize,
            "activations": "fp32 in and out (weight-only); accuracy_level 4 lets MatMulNBits "
                           "quantize activation blocks to int8 inside its dot products"
                           if level == ACCURACY_LEVEL else "float16 (q4f16); accuracy_level 0: "
                           "each provider's own compute type",
            "accuracy_level": level,
            "method": "onnxruntime MatMulNBitsQuantizer", "block_size": BLOCK_SIZE,
            "symmetric": True, "matmuls": counts,
            "check": "top-1 agreement with fp32 instead of the parity grid",
        }
        variant.notes.extend(experts_entry(protos, options.quantize,
                                           variant.manifest["quantization"]))
    if options.dtype == FP16:
        progress("converting to float16 (positions, masks, softmax and RMS norms kept "
                 "float32)...")
        variant.manifest["precision"] = _to_float16(protos)
        variant.notes.append(f"float16 weights and activations in {len(protos)} graph(s)")
    if options.quantize or options.dtype == FP16:
        entry = variant.manifest["quantization" if options.quantize else "precision"]
        renamed = [file for file in contract_files
                   if file in entry.get("matmuls", protos)]  # quantized, or all in fp16
        moved = _store_under_dtype_names(protos, renamed, options.quantize, options.dtype)
        entry["stored_as"] = moved
        dtype = client_dtype_of(options.quantize, options.dtype)
        variant.notes.extend(f"{file} stored as {stored} (transformers.js dtype {dtype})"
                             for file, stored in moved.items())
    return variant


def _to_float16(protos: dict[str, onnx.ModelProto]) -> dict[str, Any]:
    """Every graph in float16 (export/onnx/precision.py); the manifest's `precision` entry."""
    kept = {}
    for file in list(protos):
        protos[file], plan = to_float16(protos[file], file)
        kept[file] = plan.counts()
    return {"dtype": FP16, "io": "float16 in and out: logits, hidden states and the cache",
            "float32_nodes": kept,
            "float32_why": "positions and masks (computed from position ids, masks and shapes "
                           "alone), softmax and the Add of its mask, RMS norms' reductions: "
                           "as transformers computes them in float16 models",
            "check": "parity against PyTorch run in float16 and float32: within 3 (2) x PyTorch "
                     "float16's own largest distance from float32, plus one float16 step at "
                     "the output's largest magnitude"}


def _place_gguf_blocks(protos: dict[str, onnx.ModelProto], gguf: GGUFWeights,
                       variant: VariantResult, progress: Callable[[str], None]) -> None:
    """--quantize gguf: every graph's linears (and experts) hold the file's own blocks."""
    progress("placing the GGUF file's own blocks (MatMulNBits, GatherBlockQuantized)...")
    counts, placements = {}, {}
    for file in list(protos):
        protos[file], counts[file], placements[file] = quantize_gguf(
            protos[file], gguf.forms, gguf.weights, file)
        variant.notes.append(f"{counts[file]} MatMulNBits in {file} hold the file's blocks")
    variant.notes.append(type_counts_line(gguf.blocks))
    notes, expert_forms, described = expert_outcome(protos, placements, gguf.blocks,
                                                    gguf.forms)
    variant.notes.extend(notes)
    variant.manifest["quantization"] = manifest_entry(gguf.blocks, gguf.forms, counts,
                                                      expert_forms, described)


def _store_under_dtype_names(protos: dict[str, onnx.ModelProto], quantized: list[str],
                             choice: str | None, dtype: str) -> dict[str, str]:
    """Rename the quantized (or float16) client graphs in `protos` (keeping their order);
    {old: new}."""
    moved = {file: quantized_name(file, choice, dtype) for file in quantized
             if file.startswith(CLIENT_FOLDER)}
    renamed = {moved.get(file, file): proto for file, proto in protos.items()}
    protos.clear()
    protos.update(renamed)
    return moved


def layout_under_dtype_names(layout: dict[str, onnx.ModelProto], entry: dict[str, Any],
                             choice: str | None, dtype: str) -> dict[str, str]:
    """Rename, in `layout` and its manifest `entry`'s graphs, each layout graph a quantized
    export made with quantized operators (int8-dynamic leaves the decoder's steps fp32, but the
    merged decoder's first step holds encoder.onnx's quantized cross projection), or every one
    of a float16 export; {old: new}."""
    moved = {file: quantized_name(file, choice, dtype) for file, proto in layout.items()
             if dtype == FP16 or _holds_quantized(proto.graph)}
    for files in (layout, entry["graphs"]):
        renamed = {moved.get(file, file): value for file, value in files.items()}
        files.clear()
        files.update(renamed)
    return moved


def _holds_quantized(graph: onnx.GraphProto) -> bool:
    """A quantized operator in `graph` or in a subgraph (the merged decoder's `If` branches)."""
    return any(node.op_type in (*QUANTIZED_OPS, "MatMulNBits") or any(
        _holds_quantized(attribute.g) for attribute in node.attribute
        if attribute.type == onnx.AttributeProto.GRAPH) for node in graph.node)


def _quantize_dynamic(protos: dict[str, onnx.ModelProto], card: Card, family: Family,
                      variant: VariantResult, progress: Callable[[str], None],
                      tokenizer: Tokenizer | None, options: ExportOptions) -> list[str]:
    settings = DynamicSettings.for_this_cpu()
    if options.calibration is not None:
        text = display_path(options.calibration)
        calibration = calibration_batch(card, tokenizer, options.calibration_rows(), text)
    else:
        text = "the shipped text" if tokenizer is not None else "random ids"
        calibration = calibration_batch(card, tokenizer)
    progress(f"quantizing MatMuls to {DYNAMIC} (weights int8, activations at run time"
             f"{', reduce_range: this CPU has no VNNI' if settings.reduce_range else ''}; "
             f"smoothing calibrated on {len(calibration['input_ids'])} rows of {text})...")
    counts, rewrites = {}, {}
    for file in family.dynamic_files:
        protos[file], counts[file], report = quantize_dynamic_graph(
            protos[file], settings, card["d_model"], card["d_ff"], calibration)
        rewrites[file] = report.as_dict()
    variant.manifest["quantization"] = {
        "weights": DYNAMIC, **settings.as_dict(),
        "rewrites": {"smoothing": "the MatMuls reading a LayerNormalization, where it helps",
                     "per_token": "the feed-forward output projection's input",
                     "calibration": f"{len(calibration['input_ids'])} rows of {text}",
                     "files": rewrites},
        "method": "onnxruntime quantize_dynamic (MatMulInteger; DynamicQuantizeMatMul once "
                  "ONNX Runtime has fused it)", "matmuls": counts,
        "check": "quality gate against fp32 (sentence vectors' cosine, label agreement and "
                 "probability change, MLM top-1) instead of the parity grid",
    }
    return [f"quantized {count} MatMuls in {file} to {DYNAMIC} ({done['smoothed_matmuls']} "
            f"smoothed, {done['per_token_matmuls']} with per-token scales)"
            for (file, count), done in zip(counts.items(), rewrites.values(), strict=True)]
