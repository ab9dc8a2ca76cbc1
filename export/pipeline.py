"""From a card name or built folder to a verified export folder: the steps `zoo export` runs."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from torch import nn

from export.agreement import AgreementError, AgreementReport, check_agreement
from export.engines import TorchEngine
from export.generate import generate
from export.manifest import add_to_manifest
from export.onnx_export import DEFAULT_OPSET, Variant, export_onnx
from export.parity import (
    DEFAULT_ATOL,
    DEFAULT_RTOL,
    GENERATION_STEPS,
    ParityError,
    Report,
    check_parity,
)
from export.quantize import check_choice
from export.runtime import Runtime
from registry.catalog import Card
from zoo.files.sources import load_source
from zoo.files.tokenizer import tokenizer_files

__all__ = ["export_and_verify", "load_source"]


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


def shared_cache_matches_plain(runtime: Runtime, steps: int = GENERATION_STEPS, seed: int = 0
                               ) -> tuple[str, bool, int]:
    """Greedy tokens of the shared-cache loop against the plain loop, left-padded batch of 2."""
    card = runtime.card
    rng = np.random.default_rng(seed)
    steps = min(steps, card["max_positions"] - 5)
    prompt = rng.integers(3, card["vocab_size"], (2, 5), dtype=np.int64)
    mask = np.array([[1] * 5, [0, 0, 1, 1, 1]], np.int64)
    fast = generate(runtime, prompt, mask, steps)
    plain = generate(runtime, prompt, mask, steps, shared_cache=False)
    return "shared-cache loop vs plain loop", bool(np.array_equal(fast, plain)), steps


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
) -> Report | VariantReport:
    """Export, then check parity on the staged files; the folder lands only if it passed.

    A quantized export cannot meet fp32 tolerances: it passes the agreement check instead
    (export/agreement.py). An optimized decoder also proves that its shared-cache loop picks
    the plain loop's tokens.
    """
    if quantize:
        check_choice(quantize)  # before minutes of exporting
    variant = Variant(optimize, quantize)

    def verify(staging: Path) -> Report | VariantReport:
        runtime = Runtime(staging, provider)
        if quantize:
            progress(f"checking {quantize} against fp32 PyTorch (top-1 agreement)...")
            check = check_agreement(TorchEngine(model, card), runtime, quantize)
            if not check.passed:
                raise AgreementError(check)
            add_to_manifest(staging, {"quantization": {**variant.manifest["quantization"],
                                                       "agreement": check.as_dict()}})
        else:
            progress(f"checking parity against ONNX Runtime ({provider})...")
            check = check_parity(TorchEngine(model, card), runtime, atol, rtol)
            if runtime.kv_graph is not None:
                check.generation.append(shared_cache_matches_plain(runtime))
            if not check.passed:
                raise ParityError(check)
        return check if variant.plain else VariantReport(variant.notes, check)

    extra = tokenizer_files(source_folder) if source_folder is not None else []
    return export_onnx(model, card, out, opset, force, verify, progress, extra, variant)
