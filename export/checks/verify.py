"""verify(): the one check an export passes, run by `zoo export` before the folder lands and by
`zoo parity` on a folder: the parity grid, or for a quantized export the agreement check (an
int8-dynamic export: the quality gate, export/checks/quality.py); an
optimized decoder also proves that its shared-cache loop picks the plain loop's tokens."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
from torch import nn

from export.checks.agreement import STEPS, THRESHOLDS, AgreementError, AgreementReport
from export.checks.layout import check_layout
from export.checks.parity import (
    DEFAULT_ATOL,
    DEFAULT_RTOL,
    GENERATION_STEPS,
    ParityError,
    Report,
    check_parity,
)
from export.checks.quality import GateError, GateReport
from export.onnx.contract import LAYOUT
from export.onnx.quantize import DYNAMIC
from export.runtime.engine import Engine
from export.runtime.engines import TorchEngine
from export.runtime.generate import generate
from export.runtime.sessions import Runtime
from registry.catalog import Card


def check_agreement(reference: Engine, candidate: Engine, quantization: str,
                    steps: int = STEPS, seed: int = 0) -> AgreementReport:
    report = AgreementReport(quantization, THRESHOLDS[quantization])
    report.rows.append(reference.family.agreement(reference, candidate, steps, seed))
    return report


def check_quality(reference: Engine, candidate: Engine, seed: int = 0) -> GateReport:
    return GateReport(DYNAMIC, reference.family.quality(reference, candidate, seed))


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


def verify(model: nn.Module, card: Card, runtime: Runtime, atol: float = DEFAULT_ATOL,
           rtol: float = DEFAULT_RTOL, progress: Callable[[str], None] = lambda message: None
           ) -> Report | AgreementReport | GateReport:
    """The report of the check `runtime`'s export needs; raises ParityError, AgreementError or
    GateError (each carrying its report) when it fails. An export with the clients' seq2seq
    layout also proves it computes what its own graphs compute (checks/layout.py)."""
    reference = TorchEngine(model, card, runtime.family,
                            attentions="attentions" in runtime.manifest)
    layout = None
    if LAYOUT in runtime.manifest:
        progress("checking the seq2seq layout against the export's own graphs...")
        layout = check_layout(runtime, atol, rtol)
    quantization = runtime.manifest.get("quantization")
    if quantization:
        if layout is not None and not layout.passed:  # the layout beside quantized graphs
            raise ParityError(layout)
        return _quantized(reference, runtime, quantization["weights"], progress)
    progress(f"checking parity against ONNX Runtime ({runtime.provider})...")
    report = check_parity(reference, runtime, atol, rtol)
    if runtime.kv_graph is not None:
        report.generation.append(shared_cache_matches_plain(runtime))
    if layout is not None:
        report.rows += layout.rows
        report.generation += layout.generation
    if not report.passed:
        raise ParityError(report)
    return report


def _quantized(reference: Engine, runtime: Runtime, weights: str,
               progress: Callable[[str], None]) -> AgreementReport | GateReport:
    if weights == DYNAMIC:
        progress(f"checking {DYNAMIC} against fp32 PyTorch (quality gate)...")
        gate = check_quality(reference, runtime)
        if not gate.passed:
            raise GateError(gate)
        return gate
    progress(f"checking {weights} against fp32 PyTorch (top-1 agreement)...")
    agreement = check_agreement(reference, runtime, weights)
    if not agreement.passed:
        raise AgreementError(agreement)
    return agreement
