"""verify(): the one check an export passes, run by `zoo export` before the folder lands and by
`zoo parity` on a folder: the parity grid, or for a quantized export the agreement check (an
int8-dynamic export: the quality gate, export/checks/quality.py); an optimized decoder also
proves that its shared-cache loop gives the plain loop's logits and tokens."""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
from torch import nn

from export.checks.agreement import STEPS, THRESHOLDS, AgreementError, AgreementReport
from export.checks.cases import local_window
from export.checks.half import check_float16
from export.checks.layout import check_layout
from export.checks.parity import (
    DEFAULT_ATOL,
    DEFAULT_RTOL,
    GENERATION_STEPS,
    ParityError,
    Report,
    Row,
    check_parity,
    compare,
)
from export.checks.quality import GateError, GateReport
from export.checks.speech_layout import check_speech_layout
from export.onnx.precision import FP16
from export.onnx.quantize import DYNAMIC
from export.onnx.shared_cache import KV_FILE
from export.torch_engine import TorchEngine
from registry.catalog import Card
from registry.stems import is_mel_card
from runtime.contract import LAYOUT
from runtime.engine import Engine
from runtime.generate import open_session
from runtime.sessions import Runtime


def check_agreement(reference: Engine, candidate: Engine, quantization: str,
                    steps: int = STEPS, seed: int = 0) -> AgreementReport:
    report = AgreementReport(quantization, THRESHOLDS[quantization])
    report.rows.append(reference.family.agreement(reference, candidate, steps, seed))
    return report


def check_quality(reference: Engine, candidate: Engine, seed: int = 0) -> GateReport:
    return GateReport(DYNAMIC, reference.family.quality(reference, candidate, seed))


def shared_cache_matches_plain(runtime: Runtime, atol: float = DEFAULT_ATOL,
                               rtol: float = DEFAULT_RTOL, steps: int = GENERATION_STEPS,
                               seed: int = 0, near_tie: float = 0.0
                               ) -> tuple[Row, tuple[str, bool, int]]:
    """The shared-cache loop against the plain loop on a left-padded batch of 2, both fed the
    plain loop's greedy tokens: every step's logits within the parity tolerance (a row of the
    table) and the same greedy tokens. Tokens alone once passed a graph whose rotary tables
    missed YaRN's scale: the argmax survived, the logits did not. With local layers the prompt
    is longer than their window (GroupQueryAttention's local_window_size at work from the
    first pass), where the context allows. `near_tie` (a float16 export's): a token may differ
    where the plain loop's own token leads the other by no more than that."""
    card = runtime.card
    rng = np.random.default_rng(seed)
    window = local_window(card)
    length = 5 if window is None or window + 3 + 5 > card["max_positions"] else window + 3
    steps = min(steps, card["max_positions"] - length)
    prompt = rng.integers(3, card["vocab_size"], (2, length), dtype=np.int64)
    mask = np.ones((2, length), np.int64)
    mask[1, :2] = 0  # the second row left-padded
    fast = open_session(runtime, prompt.shape[1] + steps, shared_cache=True)
    plain = open_session(runtime, prompt.shape[1] + steps, shared_cache=False)
    fast_logits, plain_logits = fast.prefill(prompt, mask), plain.prefill(prompt, mask)
    row = Row(f"{KV_FILE[5:-5]}:logits", f"b2 loop {steps} steps padded", 0.0, 0.0, True)
    same = True
    for index in range(steps):
        max_abs, max_rel, passed = compare(plain_logits, fast_logits, atol, rtol)
        row.max_abs, row.max_rel = max(row.max_abs, max_abs), max(row.max_rel, max_rel)
        row.passed = row.passed and passed
        tokens = plain_logits.argmax(axis=-1)
        theirs = fast_logits.argmax(axis=-1)
        lead = plain_logits[np.arange(len(tokens)), tokens] - plain_logits[
            np.arange(len(tokens)), theirs]
        same = same and bool(np.all((tokens == theirs) | (lead <= near_tie)))
        if index + 1 < steps:
            fast_logits, plain_logits = fast.step(tokens), plain.step(tokens)
    return row, ("shared-cache loop vs plain loop", same, steps)


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
        # Whisper's layout reads frames and no masks (checks/speech_layout.py)
        check = check_speech_layout if is_mel_card(card) else check_layout
        layout = check(runtime, atol, rtol)
    quantization = runtime.manifest.get("quantization")
    if quantization:
        if layout is not None and not layout.passed:  # the layout beside quantized graphs
            raise ParityError(layout)
        return _quantized(reference, runtime, quantization["weights"], progress)
    half = runtime.manifest.get("precision", {}).get("dtype") == FP16
    if half:
        progress(f"checking parity against PyTorch in float16 ({runtime.provider})...")
        report = check_float16(model, reference, runtime)
    else:
        progress(f"checking parity against ONNX Runtime ({runtime.provider})...")
        report = check_parity(reference, runtime, atol, rtol)
    if runtime.kv_graph is not None:
        near_tie = 0.0
        if half:  # both loops in float16: within the grid's derived logits tolerance, a
            # near tie within twice its unpadded cases' (padding rows round far apart)
            logits = [r for r in report.rows if r.output == "logits" and r.tolerance]
            atol, rtol = max(r.tolerance or 0.0 for r in logits), 0.0
            near_tie = 2 * max((r.tolerance or 0.0 for r in logits if "padded" not in r.case),
                               default=0.0)
        row, tokens = shared_cache_matches_plain(runtime, atol, rtol, near_tie=near_tie)
        if half:  # the table's columns are then "vs PyTorch fp16" and "vs fp32"
            row.tolerance, row.max_rel = atol, math.nan
        report.rows.append(row)
        report.generation.append(tokens)
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
