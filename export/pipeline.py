"""From a card name or built folder to a verified export folder: the steps `zoo export` runs."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from torch import nn

from export.engines import TorchEngine
from export.onnx_export import DEFAULT_OPSET, export_onnx
from export.parity import DEFAULT_ATOL, DEFAULT_RTOL, ParityError, Report, check_parity
from export.runtime import Runtime
from registry.catalog import Card, open_catalog
from zoo.build import build_model
from zoo.weights import CONFIG, load_built


def load_source(source: str, registries: tuple[str, ...] = (), seed: int = 0,
                overrides: dict[str, Any] | None = None) -> tuple[nn.Module, Card]:
    """A built folder (with config.yaml) is loaded; anything else is a card name to build."""
    folder = Path(source)
    if (folder / CONFIG).is_file():
        return load_built(folder)
    card = open_catalog(registries).get(source, overrides)
    return build_model(card, seed=seed), card


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
) -> Report:
    """Export, then check parity on the staged files; the folder lands only if it passed."""

    def verify(staging: Path) -> Report:
        progress(f"checking parity against ONNX Runtime ({provider})...")
        report = check_parity(TorchEngine(model, card), Runtime(staging, provider), atol, rtol)
        if not report.passed:
            raise ParityError(report)
        return report

    return export_onnx(model, card, out, opset, force, verify, progress)
