"""The check a `--dtype fp16` export passes: the parity grid against PyTorch run in float16,
with a tolerance derived from the case itself rather than tuned.

Float16 rounds every stored activation to 11 significant bits, so no fixed tolerance suits
every model and length. What the check knows is how far PyTorch's own float16 run lies from
its float32 run on the same inputs (`noise`, per row of the table: an output, or every layer's
cache together; and per case): that is the rounding this model accumulates in float16. ONNX
Runtime's float16 graph rounds at the same places (the same float32 islands:
export/onnx/precision.py) but not with the same arithmetic (its kernels, fusions and order of
sums are its own). The check assumes its error is at most twice PyTorch's (measured: 1.6x on
SmolLM2-135M's cache, batch 3 of 128 tokens, on an Intel CPU with AVX-512 FP16 and AMX), so
an element passes when it lies within

    2 x noise + one float16 step at the output's largest magnitude    of PyTorch float32,
    3 x noise + that step                                             of PyTorch float16

(the second by the triangle inequality through float32; the step: the one rounding of the
result itself that two correct engines may land either side of). Greedy tokens are compared
teacher-forced along PyTorch float16's continuation; a position counts against the export only
where PyTorch's top-two logits differ by more than twice that step's logits tolerance (a
nearer tie is rounding).
"""

from __future__ import annotations

import copy
import math

import numpy as np
from torch import nn

from export.checks.cases import random_ids
from export.checks.parity import GENERATION_STEPS, Report, Row, row_label
from export.torch_engine import TorchEngine
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
    """(against PyTorch float32, against PyTorch float16) for the outputs of one row: `float32`
    and `float16` hold them all (every layer's cache is one row)."""
    noise = float(np.abs(float16.astype(np.float64) - float32).max())
    step = float16_step(float(np.abs(float32).max()))
    return ORT_ERROR_FACTOR * noise + step, (ORT_ERROR_FACTOR + 1) * noise + step


def _flat(values: list[np.ndarray]) -> np.ndarray:
    return np.concatenate([value.astype(np.float64).ravel() for value in values])


def check_float16(model: nn.Module, reference: TorchEngine, candidate: Engine,
                  seed: int = 0) -> Report:
    """`reference`: the float32 PyTorch engine; `candidate`: the float16 export. A row's
    noise is over all its outputs: the float16 rounding a deep model accumulates shows in every
    layer's cache, and the layer it peaks in differs between two engines' roundings (SmolLM2:
    PyTorch's at layer 9, ONNX Runtime's at layer 17)."""
    family, card = reference.family, reference.card
    half = TorchEngine(half_copy(model), card, family,
                       attentions="attentions" in getattr(candidate, "manifest", {}))
    report = Report()
    for case in family.parity_cases(reference, np.random.default_rng(seed)):
        wide, narrow = reference.run(case.file, case.feeds), half.run(case.file, case.feeds)
        actual = candidate.run(case.file, case.feeds)
        rows: dict[str, list[str]] = {}
        for output in wide:
            rows.setdefault(row_label(output, case.file), []).append(output)
        for label, outputs in rows.items():
            row = Row(label, case.name, 0.0, 0.0, True, 0.0)
            report.rows.append(row)
            if any(actual[o].shape != wide[o].shape for o in outputs):
                row.passed, row.max_abs = False, math.inf
                continue
            expected, rounded, got = (_flat([values[o] for o in outputs])
                                      for values in (wide, narrow, actual))
            if expected.size == 0:
                continue
            allowed_wide, row.tolerance = tolerances(expected, rounded)
            row.max_abs = float(np.abs(got - rounded).max())
            row.max_rel = float(np.abs(got - expected).max())  # shown as "vs fp32"
            row.passed = (bool(np.isfinite(got).all()) and row.max_abs <= row.tolerance
                          and row.max_rel <= allowed_wide)
    if family.spec.generates:
        report.generation.append(_greedy(reference, half, candidate, seed))
    return report


def _greedy(reference: Engine, half: Engine, candidate: Engine, seed: int
            ) -> tuple[str, bool, int]:
    """PyTorch float16's greedy continuation of a random prompt, teacher-forced into PyTorch
    float32 and the export: a step's near tie is twice its own logits' tolerance."""
    card = half.card
    steps = min(GENERATION_STEPS, card["max_positions"] - PROMPT)
    prompt = random_ids(half, np.random.default_rng(seed), 1, PROMPT)
    sessions = [open_session(engine, PROMPT + steps, shared_cache=engine is candidate)
                for engine in (reference, half, candidate)]
    wide, narrow, actual = (session.prefill(prompt, None) for session in sessions)
    same, ties = True, 0
    for index in range(steps):
        token = narrow.argmax(axis=-1)
        if actual.argmax(axis=-1)[0] != token[0]:
            best, second = np.sort(narrow[0])[-2:][::-1]
            ties += 1
            same = same and best - second <= 2 * tolerances(wide, narrow)[1]
        if index + 1 < steps:
            wide, narrow, actual = (session.step(token) for session in sessions)
    return f"vs PyTorch fp16, teacher-forced; {ties} near-tie(s)", same, steps
