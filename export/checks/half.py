"""The check a `--dtype fp16` export passes: the parity grid against PyTorch run in float16,
with a tolerance derived from the case itself rather than tuned.

Float16 rounds every stored activation to 11 significant bits, so no fixed tolerance suits
every model and length. What the check knows is how far PyTorch's own float16 run lies from
its float32 run on the same inputs (`noise`, per output and case): that is the rounding this
model accumulates in float16. ONNX Runtime's float16 graph rounds at the same places (the same
float32 islands: export/onnx/precision.py) but not with the same arithmetic: where the CPU has
float16 instructions (AVX-512 FP16) its MatMul runs in them, elsewhere it casts to float32. The
check assumes its error is at most twice PyTorch's (measured: 1.6x on SmolLM2-135M, on a CPU
with AVX-512 FP16), so an element passes when it lies within

    2 x noise + one float16 step at the output's largest magnitude    of PyTorch float32,
    3 x noise + that step                                             of PyTorch float16

(the second by the triangle inequality through float32; the step: the one rounding of the
result itself that two correct engines may land either side of). Greedy tokens are compared
teacher-forced along PyTorch float16's continuation; a position counts against the export only
where PyTorch's top-two logits differ by more than twice the logits' tolerance (a nearer tie
is rounding).
"""

from __future__ import annotations

import copy
import math

import numpy as np
from torch import nn

from export.checks.cases import random_ids
from export.checks.parity import GENERATION_STEPS, PER_LAYER_OUTPUT, Report, Row
from export.runtime.engines import TorchEngine
from runtime.contract import MODEL_GRAPH
from runtime.engine import Engine
from runtime.generate import open_session

PROMPT = 4


def half_copy(model: nn.Module) -> nn.Module:
    """The model in float16 (its rotary frequencies stay float32: zoo/blocks/positions.py)."""
    return copy.deepcopy(model).half().eval()


def float16_step(magnitude: float) -> float:
    """The spacing of float16 values at `magnitude` (at least that of 1)."""
    return 2.0 ** (math.floor(math.log2(max(magnitude, 1.0))) - 10)


ORT_ERROR_FACTOR = 2  # ONNX Runtime's float16 error, at most this times PyTorch's


def tolerances(float32: np.ndarray, float16: np.ndarray) -> tuple[float, float]:
    """(against PyTorch float32, against PyTorch float16) for one output of one case."""
    noise = float(np.abs(float16.astype(np.float64) - float32).max())
    step = float16_step(float(np.abs(float32).max()))
    return ORT_ERROR_FACTOR * noise + step, (ORT_ERROR_FACTOR + 1) * noise + step


def check_float16(model: nn.Module, reference: TorchEngine, candidate: Engine,
                  seed: int = 0) -> Report:
    """`reference`: the float32 PyTorch engine; `candidate`: the float16 export."""
    family, card = reference.family, reference.card
    half = TorchEngine(half_copy(model), card, family,
                       attentions="attentions" in getattr(candidate, "manifest", {}))
    report = Report()
    logits_tolerance = 0.0
    for case in family.parity_cases(reference, np.random.default_rng(seed)):
        wide, narrow = reference.run(case.file, case.feeds), half.run(case.file, case.feeds)
        actual = candidate.run(case.file, case.feeds)
        grouped: dict[str, Row] = {}
        for output, expected in wide.items():
            label = PER_LAYER_OUTPUT.sub(r"\1.*", output)
            if case.file != MODEL_GRAPH:
                label = f"{case.file[:-5]}:{label}"
            row = grouped.setdefault(label, Row(label, case.name, 0.0, 0.0, True, 0.0))
            if expected.size == 0:
                continue
            allowed_wide, allowed = tolerances(expected, narrow[output])
            got = actual[output].astype(np.float64)
            if got.shape != expected.shape or not np.isfinite(got).all():
                row.passed, row.max_abs = False, math.inf
                continue
            off_half = float(np.abs(got - narrow[output]).max())
            off_wide = float(np.abs(got - expected).max())
            row.max_abs = max(row.max_abs, off_half)
            row.max_rel = max(row.max_rel, off_wide)  # shown as "vs fp32"
            row.tolerance = max(row.tolerance or 0.0, allowed)
            row.passed = row.passed and off_half <= allowed and off_wide <= allowed_wide
            if output == "logits":
                logits_tolerance = max(logits_tolerance, allowed)
        report.rows.extend(grouped.values())
    if family.generates:
        report.generation.append(_greedy(half, candidate, 2 * logits_tolerance, seed))
    return report


def _greedy(half: Engine, candidate: Engine, near_tie: float, seed: int
            ) -> tuple[str, bool, int]:
    """PyTorch float16's greedy continuation of a random prompt, teacher-forced into both."""
    card = half.card
    steps = min(GENERATION_STEPS, card["max_positions"] - PROMPT)
    prompt = random_ids(half, np.random.default_rng(seed), 1, PROMPT)
    expected_session = open_session(half, PROMPT + steps, shared_cache=False)
    actual_session = open_session(candidate, PROMPT + steps)
    expected = expected_session.prefill(prompt, None)
    actual = actual_session.prefill(prompt, None)
    same, ties = True, 0
    for index in range(steps):
        token = expected.argmax(axis=-1)
        if actual.argmax(axis=-1)[0] != token[0]:
            best, second = np.sort(expected[0])[-2:][::-1]
            ties += 1
            same = same and best - second <= near_tie
        if index + 1 < steps:
            expected, actual = expected_session.step(token), actual_session.step(token)
    return (f"vs PyTorch fp16, teacher-forced; {ties} near-tie(s) within {near_tie:.1e}",
            same, steps)
