"""Export a model to ONNX files that follow the contract, with metadata and a manifest.

Everything is written into a staging folder; the folder replaces OUT only after onnx.checker and
the parity check have both passed, so a failed export leaves nothing (and OUT untouched).
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import onnx
from torch import nn

from export.family import Family, GraphIO, contract_of, wrappers_of
from export.onnx.files import save_models, save_standalone, set_metadata, strip_debug
from export.onnx.gguf_export import GGUFWeights
from export.onnx.kept_adapters import (
    KeptLinear,
    adapter_parameters,
    kept_linears,
    manifest_entry,
    traced_with_adapters,
    with_adapter_inputs,
    with_zero_defaults,
    write_adapter_file,
)
from export.onnx.manifest import build_manifest, package_versions, write_manifest
from export.onnx.precision import FP32
from export.onnx.trace import ExportError, export_graph, trace_inputs
from export.onnx.variants import VariantResult, apply_variant, layout_under_dtype_names
from export.onnx.weights import INLINE, DiskWeights, InlineWeights
from export.options import ExportOptions
from export.targets.huggingface import write_hf_files
from registry.catalog import Card
from registry.errors import first_line
from runtime.contract import ADAPTERS, LAYOUT, adapter_file
from runtime.files.atomic import atomic_folder
from zoo.blocks.lora import base_state
from zoo.files.weights import CONFIG, WEIGHTS, card_yaml, write_weights

Progress = Callable[[str], None]
# Past this, the traced graphs' weights stay on disk while they are rewritten (export/onnx/
# weights.py): a second and third copy in memory is what a 1B-parameter model cannot afford.
DISK_WEIGHTS_BYTES = 1 << 30
SCRATCH = ".traced"  # inside the staging folder: gone with it if the export fails


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


@dataclass
class Written:
    """What an export wrote: the manifest (as it landed), what the variants did, and what
    `verify` returned."""

    manifest: dict[str, Any]
    notes: list[str]
    check: Any


Verify = Callable[[Path, dict[str, Any]], Any]


def export_onnx(
    model: nn.Module,
    card: Card,
    out: Path,
    family: Family,
    options: ExportOptions | None = None,
    verify: Verify | None = None,
    progress: Progress = lambda message: None,
    extra_files: list[Path] | tuple[Path, ...] = (),
    gguf: GGUFWeights | None = None,
    adapter: str | None = None,
) -> Written:
    """Write the ONNX files, reference weights, config and manifest to `out`.

    `verify(staging, manifest)` runs on the staged files before the folder is moved into
    place (the parity check); it may add to the manifest (the agreement check's figures),
    which is written once, after it. When it raises, nothing is written. `adapter`: the name
    of the adapter an `--adapters keep` export keeps apart (export/onnx/kept_adapters.py).
    """
    options = options or ExportOptions()
    model = model.eval()
    versions = package_versions()
    metadata = _metadata(card, options.opset, versions)
    graphs = family.graphs(card)  # once per export: contract, wrappers and manifest share it
    contract = contract_of(graphs, card, options.attentions)
    kept = kept_linears(model) if adapter is not None else []
    if kept:
        contract = {file: (with_adapter_inputs(inputs, len(graphs[file].inputs), kept),
                           outputs) for file, (inputs, outputs) in contract.items()}
    with atomic_folder(Path(out), options.force) as staging:
        _write_reference(model, card, staging, extra_files)
        weights = _weights_for(model, staging)
        protos = _traced(model, card, graphs, contract, options, metadata, staging, progress,
                         weights, kept)
        entries = ({"attentions": attentions_entry(graphs, contract)}
                   if options.attentions else {})
        if adapter is not None:
            write_adapter_file(adapter_parameters(model), staging / adapter_file(adapter))
            entries[ADAPTERS] = manifest_entry(kept, adapter)
        variant = VariantResult()
        if not options.plain:
            for proto in protos.values():  # the variants read and write weights themselves
                weights.load(proto)
            variant = apply_variant(protos, model, card, family, options, metadata, progress,
                                    staging, gguf)
            entries.update(variant.manifest)
        stored = variant.stored_as  # quantized client graphs under their dtype names
        genai = family.genai(card, protos, stored)  # ONNX Runtime GenAI's files (decoders)
        if genai is not None:
            protos.update(genai.graphs)
        layout = family.layout_graphs(card, protos)  # before save_models moves the weights out
        client_graphs = [*contract, *layout]  # by contract name, for config.json's dtype
        if layout:
            entries[LAYOUT] = family.layout_entry(card)
        if layout and (options.quantize or options.dtype != FP32):
            # `stored` is the manifest's quantization.stored_as (precision.stored_as)
            stored.update(layout_under_dtype_names(layout, entries[LAYOUT], options.quantize,
                                                   options.dtype))
        for proto in layout.values():
            weights.load(proto)
        if family.standalone_graphs:  # each file whole: clients that fetch no shared data
            for proto in protos.values():
                weights.load(proto)
            save_standalone(protos, staging)
        else:
            save_models(protos, staging, weights)
        save_standalone(layout, staging)
        weights.close()
        for file_name in [*protos, *layout]:
            _check(staging / file_name)
        # before the manifest, so their sha256 are recorded
        for note in write_hf_files(staging, card, client_graphs, stored):
            progress(note)
        if genai is not None:
            genai.write(staging)
        files = {stored.get(file, file): names for file, names in contract.items()}
        manifest = build_manifest(staging, card, options.opset, versions, files, entries)
        check = verify(staging, manifest) if verify is not None else None
        write_manifest(staging, manifest)
    return Written(manifest, variant.notes, check)


def _metadata(card: Card, opset: int, versions: dict[str, str]) -> dict[str, str]:
    """What every graph's metadata_props carry: the card, the package versions, the opset."""
    return {
        "zoo.card": card_yaml(card),
        "zoo.family": card.family,
        "zoo.versions": json.dumps(versions, sort_keys=True),
        "zoo.opset": str(opset),
    }


def _write_reference(model: nn.Module, card: Card, staging: Path,
                     extra_files: list[Path] | tuple[Path, ...]) -> None:
    """The PyTorch weights and card the export was made from (a kept adapter's base alone:
    what its graphs compute with zeros), and the files copied beside them (e.g. the
    tokenizer, so the export is self-contained)."""
    write_weights(model, staging / WEIGHTS, {"format": "pt"}, base_state(model))
    (staging / CONFIG).write_text(card_yaml(card), encoding="utf-8")
    for extra in extra_files:
        shutil.copyfile(extra, staging / Path(extra).name)


def weights_on_disk(model: nn.Module) -> bool:
    """A model past DISK_WEIGHTS_BYTES: its graphs' weights stay on disk while they are
    rewritten, and its check opens them with runtime/sessions.py's lean_session_options."""
    size = sum(tensor.numel() * tensor.element_size() for tensor in model.state_dict().values())
    return size > DISK_WEIGHTS_BYTES


def _weights_for(model: nn.Module, staging: Path) -> InlineWeights:
    """Where the traced graphs keep their weights: on disk or in the protos."""
    return DiskWeights(staging / SCRATCH) if weights_on_disk(model) else INLINE


def _traced(model: nn.Module, card: Card, graphs: dict[str, GraphIO],
            contract: dict[str, tuple[list[str], list[str]]], options: ExportOptions,
            metadata: dict[str, str], staging: Path, progress: Progress,
            weights: InlineWeights, kept: list[KeptLinear]) -> dict[str, onnx.ModelProto]:
    """One traced proto per contract graph, debug annotations stripped, metadata set; with
    `kept` adapters, their factors as inputs after the graph's own."""
    wrappers = wrappers_of(graphs, model, options.attentions)
    protos = {}
    for file_name, io in graphs.items():
        progress(f"exporting {file_name} (opset {options.opset})...")
        graph, (args, shapes) = wrappers[file_name], trace_inputs(io, card)
        if kept:
            graph, args, shapes = traced_with_adapters(graph, model, len(io.inputs), args,
                                                       shapes, kept)
        protos[file_name] = export_graph(graph, args, shapes, contract[file_name],
                                         options.opset, staging / file_name, weights)
        if kept:
            with_zero_defaults(protos[file_name], kept)
        strip_debug(protos[file_name])
        set_metadata(protos[file_name], metadata)
    return protos
