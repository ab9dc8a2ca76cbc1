"""From a card name or built folder to a verified export folder: the steps `zoo export` runs."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from torch import nn

from export.engines import TorchEngine
from export.onnx_export import DEFAULT_OPSET, export_onnx
from export.parity import DEFAULT_ATOL, DEFAULT_RTOL, ParityError, Report, check_parity
from export.runtime import Runtime
from registry.catalog import Card
from zoo.sources import load_source
from zoo.tokenizer import tokenizer_files

__all__ = ["export_and_verify", "load_source"]


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
) -> Report:
    """Export, then check parity on the staged files; the folder lands only if it passed."""

    def verify(staging: Path) -> Report:
        progress(f"checking parity against ONNX Runtime ({provider})...")
        report = check_parity(TorchEngine(model, card), Runtime(staging, provider), atol, rtol)
        if not report.passed:
            raise ParityError(report)
        return report

    extra = tokenizer_files(source_folder) if source_folder is not None else []
    return export_onnx(model, card, out, opset, force, verify, progress, extra)
