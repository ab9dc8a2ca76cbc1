"""Export a model to ONNX files that follow the contract, with metadata and a manifest.

Everything is written into a staging folder; the folder replaces OUT only after onnx.checker and
the parity check have both passed, so a failed export leaves nothing (and OUT untouched).
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import onnx
from torch import nn

from export.families import family_of
from export.onnx.files import save_models, set_metadata, strip_debug
from export.onnx.manifest import add_to_manifest, package_versions, write_manifest
from export.onnx.trace import DEFAULT_OPSET, ExportError, check_opset, export_graph, trace_inputs
from export.onnx.variants import Variant, apply_variant
from registry.catalog import Card
from registry.errors import first_line
from zoo.files.atomic import atomic_folder
from zoo.files.weights import CONFIG, WEIGHTS, card_yaml, weights_bytes

Progress = Callable[[str], None]


def _check(path: Path) -> None:
    try:
        onnx.checker.check_model(str(path), full_check=True)
    except (onnx.checker.ValidationError, onnx.shape_inference.InferenceError) as exc:
        raise ExportError(f"{path.name}: onnx.checker: {first_line(exc)}") from exc


def attentions_entry(graphs: dict[str, Any], contract: dict[str, tuple[list, list]]
                     ) -> dict[str, Any]:
    """What manifest.json says of an --attentions export (docs/onnx-contract.md)."""
    outputs = {file: [name for name in contract[file][1]
                      if name.rpartition(".")[0] in io.attention_groups]
               for file, io in graphs.items()}
    return {"outputs": outputs, "shape": "(batch, n_heads, query_length, key_length)",
            "values": "softmax probabilities over the keys, one map per layer"}


def export_onnx(
    model: nn.Module,
    card: Card,
    out: Path,
    opset: int = DEFAULT_OPSET,
    force: bool = False,
    verify: Callable[[Path], Any] | None = None,
    progress: Progress = lambda message: None,
    extra_files: list[Path] | tuple[Path, ...] = (),
    variant: Variant | None = None,
) -> Any:
    """Write the ONNX files, reference weights, config and manifest to `out`.

    `verify(staging)` runs before the folder is moved into place (the parity check); when it
    raises, nothing is written. Returns what `verify` returned.
    """
    variant = variant or Variant()
    check_opset(opset)
    model = model.eval()
    versions = package_versions()
    metadata = {
        "zoo.card": card_yaml(card),
        "zoo.family": card.family,
        "zoo.versions": json.dumps(versions, sort_keys=True),
        "zoo.opset": str(opset),
    }
    result = None
    with atomic_folder(Path(out), force) as staging:
        (staging / WEIGHTS).write_bytes(weights_bytes(model, {"format": "pt"}))
        (staging / CONFIG).write_text(card_yaml(card), encoding="utf-8")
        for extra in extra_files:  # e.g. the tokenizer, so the export is self-contained
            shutil.copyfile(extra, staging / Path(extra).name)
        family = family_of(card)
        contract = family.contract(card, variant.attentions)
        wrappers = family.wrappers(model, card, variant.attentions)
        if variant.attentions:
            variant.manifest["attentions"] = attentions_entry(family.graphs(card), contract)
        protos = {}
        for file_name, io in family.graphs(card).items():
            progress(f"exporting {file_name} (opset {opset})...")
            args, shapes = trace_inputs(io, card)
            protos[file_name] = export_graph(wrappers[file_name], args, shapes,
                                             contract[file_name], opset, staging / file_name)
            strip_debug(protos[file_name])
            set_metadata(protos[file_name], metadata)
        if not variant.plain:
            apply_variant(protos, model, card, opset, variant, metadata, progress)
        genai = family.genai(card, protos)  # ONNX Runtime GenAI's files (decoders)
        if genai is not None:
            protos.update(genai.graphs)
        save_models(protos, staging)
        for file_name in protos:
            _check(staging / file_name)
        if genai is not None:  # before the manifest, so their sha256 are recorded
            genai.write(staging, card)
        write_manifest(staging, card, opset, versions, contract)
        if variant.manifest:
            add_to_manifest(staging, variant.manifest)
        if verify is not None:
            result = verify(staging)
    return result
