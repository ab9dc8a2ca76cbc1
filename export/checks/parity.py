"""Parity: PyTorch against ONNX Runtime on the family's grid of shapes that differ from the
traced ones (checks/cases.py). An element passes when
|ort - torch| <= atol * scale + rtol * |torch|, where scale is the output's largest |torch| in
that case, at least 1: float32's rounding grows with the magnitudes a graph adds up, so a real
model's logits near 30 differ by 3e-4 where a tiny one's near 1 differ by 1e-6 (SmolLM2-135M,
measured), and an element near zero inside a large output is held to the output's scale, not
its own. Families that generate must also give identical greedy tokens.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

import numpy as np

from export.checks.cases import left_padding, random_ids
from registry.errors import ZooError
from runtime.contract import MODEL_GRAPH
from runtime.engine import Engine
from runtime.generate import generate

DEFAULT_ATOL, DEFAULT_RTOL = 1e-4, 1e-3
# One row for all layers' cache, and one per group for all layers' attention maps.
PER_LAYER_OUTPUT = re.compile(
    r"^(present|attentions|encoder_attentions|decoder_attentions|cross_attentions)\.\d+.*$")
GENERATION_STEPS = 32


@dataclass
class Row:
    output: str
    case: str
    max_abs: float
    max_rel: float
    passed: bool
    # a float16 export's row (export/checks/half.py): its derived tolerance; max_abs is then
    # the distance from PyTorch float16, max_rel the distance from PyTorch float32
    tolerance: float | None = None


@dataclass
class Report:
    rows: list[Row] = field(default_factory=list)
    generation: list[tuple[str, bool, int]] = field(default_factory=list)  # (what, same, steps)

    @property
    def passed(self) -> bool:
        return all(r.passed for r in self.rows) and all(same for _, same, _ in self.generation)

    def table(self) -> str:
        half = any(r.tolerance is not None for r in self.rows)
        heads = ("vs fp16", "vs fp32", "tolerance") if half else ("max abs", "max rel", "")
        lines = [f"{'output':<28} {'case':<26} {heads[0]:>10} {heads[1]:>10} {heads[2]:>10}"
                 "  pass"]
        for r in self.rows:
            allowed = f"{r.tolerance:>10.2e}" if r.tolerance is not None else " " * 10
            second = f"{r.max_rel:>10.2e}" if r.max_rel == r.max_rel else f"{'-':>10}"  # NaN
            lines.append(f"{r.output:<28} {r.case:<26} {r.max_abs:>10.2e} {second} "
                         f"{allowed}  {'yes' if r.passed else 'NO'}")
        for what, same, steps in self.generation:
            verdict = ("agree" if half else "identical") if same else "DIFFERENT"
            lines.append(f"greedy tokens ({what}, {steps} steps): {verdict}")
        lines.append("parity: " + ("PASSED" if self.passed else "FAILED"))
        return "\n".join(lines)


class ParityError(ZooError):
    def __init__(self, report: Report) -> None:
        failed = [f"{r.output} [{r.case}] max abs {r.max_abs:.2e}"
                  for r in report.rows if not r.passed]
        failed += [f"greedy tokens ({what})" for what, same, _ in report.generation if not same]
        super().__init__(f"parity failed for {len(failed)} check(s): {'; '.join(failed[:4])}")
        self.report = report


def row_label(output: str, file: str) -> str:
    """The table's row for `output` of `file`: every layer's cache (or maps) in one row, and
    graphs other than onnx/model.onnx named."""
    label = PER_LAYER_OUTPUT.sub(r"\1.*", output)
    return label if file == MODEL_GRAPH else f"{file[:-5]}:{label}"


COMPARE_CHUNK = 1 << 20  # elements compared at once: a 262k-vocabulary model's logits over
# 1,028 positions are 1 GB in float32, and each float64 temporary of them twice that


def compare(expected: np.ndarray, actual: np.ndarray, atol: float, rtol: float
            ) -> tuple[float, float, bool]:
    """(max abs difference, max relative difference, within tolerance), computed in float64
    over COMPARE_CHUNK elements at a time."""
    if expected.shape != actual.shape:
        return float("inf"), float("inf"), False
    if expected.size == 0:
        return 0.0, 0.0, True
    expected, actual = expected.reshape(-1), actual.reshape(-1)
    chunks = range(0, expected.size, COMPARE_CHUNK)
    scale = max(1.0, float(np.max([np.abs(expected[start:start + COMPARE_CHUNK]).max()
                                   for start in chunks])))
    abs_maxima, rel_maxima, passed = [], [], True
    for start in chunks:
        wanted = expected[start:start + COMPARE_CHUNK].astype(np.float64)
        difference = np.abs(actual[start:start + COMPARE_CHUNK].astype(np.float64) - wanted)
        magnitude = np.abs(wanted)
        # Relative to |expected| + atol, so that elements near zero do not dominate the figure.
        abs_maxima.append(difference.max())
        rel_maxima.append((difference / (magnitude + atol)).max())
        passed = passed and bool(np.all(difference <= atol * scale + rtol * magnitude))
    return float(np.max(abs_maxima)), float(np.max(rel_maxima)), passed  # NaN stays NaN


def check_parity(reference: Engine, candidate: Engine, atol: float = DEFAULT_ATOL,
                 rtol: float = DEFAULT_RTOL, generation_steps: int = GENERATION_STEPS,
                 seed: int = 0) -> Report:
    report = Report()
    family = reference.family
    for case in family.parity_cases(reference, np.random.default_rng(seed)):
        expected = reference.run(case.file, case.feeds)
        actual = candidate.run(case.file, case.feeds)
        grouped: dict[str, Row] = {}
        for output, value in expected.items():
            max_abs, max_rel, passed = compare(value, actual[output], atol, rtol)
            label = row_label(output, case.file)
            row = grouped.setdefault(label, Row(label, case.name, 0.0, 0.0, True))
            row.max_abs, row.max_rel = max(row.max_abs, max_abs), max(row.max_rel, max_rel)
            row.passed = row.passed and passed
        report.rows.extend(grouped.values())
        del expected, actual  # before the next case's: a large vocabulary's logits are GBs
    own = family.generation_check(reference, candidate, generation_steps, seed)
    if own is not None:  # a family whose prompts are not token ids (Whisper's audio)
        report.generation.append(own)
    elif family.spec.generates and generation_steps:
        rng = np.random.default_rng(seed)
        card = reference.card
        steps = min(generation_steps, card["max_positions"] - 4)
        prompt = random_ids(reference, rng, 2, 4)
        mask = left_padding(2, 4)
        same = np.array_equal(generate(reference, prompt, mask, steps),
                              generate(candidate, prompt, mask, steps))
        report.generation.append(("batch 2, left-padded", same, steps))
    return report
