"""Export a model to ONNX files that follow the contract, with metadata and a manifest.

Everything is written into a staging folder; the folder replaces OUT only after onnx.checker and
the parity check have both passed, so a failed export leaves nothing (and OUT untouched).
"""

from __future__ import annotations

import contextlib
import json
import logging
import shutil
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import onnx
import torch
from torch import nn
from torch.export import Dim

from export.contract import files_for
from export.graphs import DecoderGraph, EncoderGraph, SourceEncoderGraph, TargetDecoderGraph
from export.manifest import add_to_manifest, package_versions, write_manifest
from export.onnx_files import save_models, set_metadata, strip_debug
from registry.catalog import Card
from registry.errors import ZooError, first_line
from zoo.files.atomic import atomic_folder
from zoo.files.weights import CONFIG, WEIGHTS, card_yaml, weights_bytes

DEFAULT_OPSET = MIN_OPSET = 18
MAX_OPSET = 25
# torch.export specialises any dimension whose example size is 0 or 1: trace with >= 2 everywhere.
TRACE_BATCH, TRACE_SEQUENCE, TRACE_PAST, TRACE_SOURCE = 2, 3, 4, 5

Progress = Callable[[str], None]


class ExportError(ZooError):
    """The exporter or onnx.checker refused the model."""


@dataclass
class Variant:
    """What `zoo export --optimize / --quantize` adds to the plain export. The export fills
    `notes` (fused-operator counts, missing fusions, quantized MatMuls) and `manifest` (extra
    manifest.json entries) for the caller to print and check."""

    optimize: bool = False
    quantize: str | None = None  # "int8" | "int4"
    notes: list[str] = field(default_factory=list)
    manifest: dict[str, Any] = field(default_factory=dict)

    @property
    def plain(self) -> bool:
        return not self.optimize and not self.quantize


def check_opset(opset: int) -> None:
    """torch.onnx's exporter emits opset 18 and newer. 25 is the newest that it converted and
    ONNX Runtime 1.31 ran here (26 and later fail inside the exporter's version converter)."""
    if not MIN_OPSET <= opset <= MAX_OPSET:
        raise ExportError(f"--opset {opset}: supported opsets are {MIN_OPSET} to {MAX_OPSET}")


def _ids(card: Card, *shape: int) -> torch.Tensor:
    return torch.randint(3, card["vocab_size"], shape)


def _past(card: Card, batch: int, length: int) -> tuple[torch.Tensor, ...]:
    heads, head_dim = card["n_heads"], card["d_model"] // card["n_heads"]
    return tuple(torch.randn(batch, heads, length, head_dim) for _ in range(2 * card["n_layers"]))


def traced_graphs(model: nn.Module, card: Card) -> dict[str, tuple[nn.Module, tuple, tuple]]:
    """{file: (graph module, example args, dynamic shapes)} with shapes mirroring the args."""
    batch, sequence = Dim("batch"), Dim("sequence")
    past, total, source = Dim("past_sequence"), Dim("total_sequence"), Dim("encoder_sequence")
    b, t, p, s = TRACE_BATCH, TRACE_SEQUENCE, TRACE_PAST, TRACE_SOURCE
    ones = torch.ones
    if card.family == "decoder":
        args = (_ids(card, b, t), ones(b, p + t, dtype=torch.long),
                torch.arange(p, p + t).expand(b, t).contiguous(), _past(card, b, p))
        shapes = ({0: batch, 1: sequence}, {0: batch, 1: total}, {0: batch, 1: sequence},
                  tuple({0: batch, 2: past} for _ in args[3]))
        return {"model.onnx": (DecoderGraph(model), args, shapes)}
    if card.family == "encoder":
        with_types = bool(card["type_vocab_size"])
        args = (_ids(card, b, t), ones(b, t, dtype=torch.long))
        if with_types:
            args += (torch.zeros(b, t, dtype=torch.long),)
        shapes = tuple({0: batch, 1: sequence} for _ in args)
        return {"model.onnx": (EncoderGraph(model, with_types), args, shapes)}
    encoder_args = (_ids(card, b, s), ones(b, s, dtype=torch.long))
    decoder_args = (_ids(card, b, t), torch.randn(b, s, card["d_model"]),
                    ones(b, s, dtype=torch.long), _past(card, b, p))
    return {
        "encoder.onnx": (SourceEncoderGraph(model), encoder_args,
                         ({0: batch, 1: source}, {0: batch, 1: source})),
        "decoder.onnx": (TargetDecoderGraph(model), decoder_args,
                         ({0: batch, 1: sequence}, {0: batch, 1: source}, {0: batch, 1: source},
                          tuple({0: batch, 2: past} for _ in decoder_args[3]))),
    }


def _export_one(graph: nn.Module, args: tuple, shapes: tuple, names: tuple[list, list],
                opset: int, path: Path) -> onnx.ModelProto:
    with warnings.catch_warnings(), quiet_loggers("torch.onnx", "onnxscript", "torch.export"):
        warnings.simplefilter("ignore")  # the exporter's own chatter; failures still raise
        try:
            program = torch.onnx.export(
                graph, args, dynamic_shapes=shapes, input_names=names[0],
                output_names=names[1], opset_version=opset, dynamo=True, verbose=False,
            )
        except Exception as exc:  # the exporter raises many types; report one line
            raise ExportError(f"{path.name}: torch.onnx.export failed: {first_line(exc)}") from exc
    return program.model_proto


@contextlib.contextmanager
def quiet_loggers(*names: str) -> Iterator[None]:
    """The exporter logs warnings and caught tracebacks; we report failures ourselves."""
    loggers = [logging.getLogger(name) for name in names]
    levels = [logger.level for logger in loggers]
    for logger in loggers:
        logger.setLevel(logging.CRITICAL)
    try:
        yield
    finally:
        for logger, level in zip(loggers, levels, strict=True):
            logger.setLevel(level)


def _check(path: Path) -> None:
    try:
        onnx.checker.check_model(str(path), full_check=True)
    except (onnx.checker.ValidationError, onnx.shape_inference.InferenceError) as exc:
        raise ExportError(f"{path.name}: onnx.checker: {first_line(exc)}") from exc


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
        contract = files_for(card.fields)
        protos = {}
        for file_name, (graph, args, shapes) in traced_graphs(model, card).items():
            progress(f"exporting {file_name} (opset {opset})...")
            with torch.no_grad():
                protos[file_name] = _export_one(graph, args, shapes, contract[file_name], opset,
                                                staging / file_name)
            strip_debug(protos[file_name])
            set_metadata(protos[file_name], metadata)
        if not variant.plain:
            from export.variants import apply_variant

            apply_variant(protos, model, card, opset, variant, metadata, progress)
        save_models(protos, staging)
        for file_name in protos:
            _check(staging / file_name)
        write_manifest(staging, card, opset, versions)
        if variant.manifest:
            add_to_manifest(staging, variant.manifest)
        if verify is not None:
            result = verify(staging)
    return result
