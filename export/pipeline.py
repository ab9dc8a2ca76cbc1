"""From a card name or built folder to a verified export folder: the steps `zoo export` runs."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from torch import nn

from export.checks.agreement import AgreementReport
from export.checks.parity import DEFAULT_ATOL, DEFAULT_RTOL, Report
from export.checks.verify import verify
from export.onnx.manifest import add_to_manifest
from export.onnx.quantize import check_choice
from export.onnx.trace import DEFAULT_OPSET
from export.onnx.variants import Variant
from export.onnx.writer import export_onnx
from export.runtime.sessions import Runtime, require_provider
from registry.catalog import Card
from zoo.files.tokenizer import tokenizer_files


@dataclass
class VariantReport:
    """An --optimize / --quantize export: what was done (fused-operator counts, missing
    fusions, quantized MatMuls) and the check it passed (parity grid or agreement)."""

    notes: list[str] = field(default_factory=list)
    check: Report | AgreementReport | None = None

    @property
    def passed(self) -> bool:
        return self.check is not None and self.check.passed

    def table(self) -> str:
        return "\n".join([*self.notes, self.check.table() if self.check else ""])


def export_and_verify(
    model: nn.Module,
    card: Card,
    out: Path,
    opset: int = DEFAULT_OPSET,
    provider: str = "cpu",
    atol: float = DEFAULT_ATOL,
    rtol: float = DEFAULT_RTOL,
    force: bool = False,
    progress: Callable[[str], None] = lambda message: None,
    source_folder: Path | None = None,
    optimize: bool = False,
    quantize: str | None = None,
    attentions: bool = False,
) -> Report | VariantReport:
    """Export, then check parity on the staged files; the folder lands only if it passed.

    What is checked is export/checks/verify.py's: the parity grid, or for a quantized export
    the agreement check; an optimized decoder also proves its shared-cache loop.
    """
    require_provider(provider)  # before minutes of exporting
    if quantize:
        check_choice(quantize)
    variant = Variant(optimize, quantize, attentions)

    def verify_staged(staging: Path) -> Report | VariantReport:
        check = verify(model, card, Runtime(staging, provider), atol, rtol, progress)
        if isinstance(check, AgreementReport):  # recorded beside what was quantized
            add_to_manifest(staging, {"quantization": {**variant.manifest["quantization"],
                                                       "agreement": check.as_dict()}})
        return check if variant.plain else VariantReport(variant.notes, check)

    extra = tokenizer_files(source_folder) if source_folder is not None else []
    return export_onnx(model, card, out, opset, force, verify_staged, progress, extra, variant)
