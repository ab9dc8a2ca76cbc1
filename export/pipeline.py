"""From a card name or built folder to a verified export folder: the steps `zoo export` runs,
where its family is resolved once and handed to the writer, the variants and the check."""

from __future__ import annotations

import ctypes
import gc
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from torch import nn

from export.checks.agreement import AgreementReport
from export.checks.parity import Report
from export.checks.quality import GateReport, calibration_batch
from export.checks.verify import verify
from export.families import family_of
from export.onnx.gguf_export import GGUFWeights, gguf_weights
from export.onnx.kept_adapters import adapter_name
from export.onnx.precision import FP16, check_weights_fit
from export.onnx.quantize import GGUF
from export.onnx.writer import export_onnx, weights_on_disk
from export.opening import open_staged
from export.options import KEEP, ExportOptions
from registry.catalog import Card
from registry.errors import ZooError
from registry.paths import display_path
from runtime.contract import ADAPTERS
from runtime.files.images import processor_file
from runtime.files.tokenizer import load_tokenizer, tokenizer_files
from runtime.sessions import lean_session_options
from runtime.speech_tokens import speech_files


@dataclass
class VariantReport:
    """An --optimize / --quantize export: what was done (fused-operator counts, missing
    fusions, quantized MatMuls) and the check it passed (parity grid or agreement)."""

    notes: list[str] = field(default_factory=list)
    check: Report | AgreementReport | GateReport | None = None

    @property
    def passed(self) -> bool:
        return self.check is not None and self.check.passed

    def table(self) -> str:
        return "\n".join([*self.notes, self.check.table() if self.check else ""])


def export_and_verify(
    model: nn.Module,
    card: Card,
    out: Path,
    options: ExportOptions | None = None,
    progress: Callable[[str], None] = lambda message: None,
    source_folder: Path | None = None,
) -> Report | VariantReport:
    """Export, then check parity on the staged files; the folder lands only if it passed.

    What is checked is export/checks/verify.py's: the parity grid, or for a quantized export
    the agreement check; an optimized decoder also proves its shared-cache loop.
    """
    options = options or ExportOptions()
    options.check()  # before minutes of exporting
    family = family_of(card)  # once: the writer, the variants and the check share it
    family.check_quantization(card, options.quantize)
    family.check_dtype(card, options.dtype)
    if options.optimize:
        family.check_optimize(card)
    if options.attentions and not any(io.attention_groups for io in family.graphs(card).values()):
        raise ZooError(f"{card.name}: --attentions: a {family.spec.kind}'s graphs have no "
                       "attention maps to add (zoo attention reads them from an encoder, a "
                       "decoder, an encoder-decoder or a ViT)")
    if options.dtype == FP16:
        check_weights_fit(model, card.name)
    gguf = _gguf_weights(model, card, options, source_folder)
    if options.calibration is not None:  # every refusal of the file before the trace
        tokenizer = load_tokenizer(source_folder) if source_folder is not None else None
        calibration_batch(card, tokenizer, options.calibration_rows(),
                          display_path(options.calibration))

    def verify_staged(staging: Path, manifest: dict[str, Any]
                      ) -> Report | AgreementReport | GateReport:
        lean = None
        if weights_on_disk(model):
            lean = lean_session_options()
            _return_freed_memory()
        runtime = open_staged(staging, manifest, options.provider, options=lean)
        if ADAPTERS in manifest:  # the graph fed its adapter file against the LoRA model
            name = next(iter(manifest[ADAPTERS]["files"]))
            progress(f"the parity grid runs with adapter {name} fed "
                     f"({manifest[ADAPTERS]['files'][name]})...")
            runtime.adapters.activate(name)
        check = verify(model, card, runtime, options.atol, options.rtol, progress)
        if isinstance(check, AgreementReport | GateReport):  # beside what was quantized
            manifest["quantization"]["agreement"] = check.as_dict()
        return check

    extra = tokenizer_files(source_folder) if source_folder is not None else []
    processor = processor_file(source_folder, card) if source_folder is not None else None
    extra += [processor] if processor is not None else []
    extra += speech_files(source_folder, card) if source_folder is not None else []
    adapter = adapter_name(source_folder) if options.adapters == KEEP and source_folder \
        else None
    written = export_onnx(model, card, out, family, options, verify_staged, progress, extra,
                          gguf, adapter)
    return written.check if options.plain else VariantReport(written.notes, written.check)


def _return_freed_memory() -> None:
    """Hand what the trace freed back to the system before the check: glibc keeps freed heap
    pages (a third of a GiB after gemma-3-1b's trace), and the check of a model that size
    holds it twice over (PyTorch's copy and ONNX Runtime's). Elsewhere, nothing."""
    gc.collect()
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):  # not glibc
        pass


def _gguf_weights(model: nn.Module, card: Card, options: ExportOptions,
                  source_folder: Path | None) -> GGUFWeights | None:
    """--quantize gguf's blocks, read and checked before the trace; a card name (no imported
    folder) is refused in one line."""
    if options.quantize != GGUF:
        return None
    if source_folder is None:
        raise ZooError(f"{card.name}: --quantize gguf exports a folder made by `zoo import "
                       "FILE.gguf` (it keeps the file's blocks), not a card")
    tied = bool(card.fields.get("tie_embeddings"))
    return gguf_weights(source_folder, model.state_dict(), tied)
