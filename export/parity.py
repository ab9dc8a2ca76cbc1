"""Parity: PyTorch against ONNX Runtime on a grid of shapes that differ from the traced ones.

Batch 1 and 3; sequence 1, a middle length and the card's maximum; past length 0 and > 0; rows
with padding. An element passes when |ort - torch| <= atol + rtol * |torch| (numpy's allclose).
For the decoder and the encoder-decoder, greedy generation must also give identical tokens.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

import numpy as np

from export.contract import past_names
from export.engines import Engine
from export.generate import empty_past, generate
from registry.errors import ZooError

DEFAULT_ATOL, DEFAULT_RTOL = 1e-4, 1e-3
CACHE_OUTPUT = re.compile(r"^(present)\.\d+\..*$")
GENERATION_STEPS = 32


@dataclass
class Case:
    name: str
    file: str
    feeds: dict[str, np.ndarray]


@dataclass
class Row:
    output: str
    case: str
    max_abs: float
    max_rel: float
    passed: bool


@dataclass
class Report:
    rows: list[Row] = field(default_factory=list)
    generation: list[tuple[str, bool, int]] = field(default_factory=list)  # (what, same, steps)

    @property
    def passed(self) -> bool:
        return all(r.passed for r in self.rows) and all(same for _, same, _ in self.generation)

    def table(self) -> str:
        lines = [f"{'output':<28} {'case':<26} {'max abs':>10} {'max rel':>10}  pass"]
        for r in self.rows:
            lines.append(f"{r.output:<28} {r.case:<26} {r.max_abs:>10.2e} {r.max_rel:>10.2e}  "
                         f"{'yes' if r.passed else 'NO'}")
        for what, same, steps in self.generation:
            verdict = "identical" if same else "DIFFERENT"
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


def _lengths(limit: int) -> tuple[int, int]:
    """A middle sequence length and a past length that fit within `limit` together."""
    return max(2, limit // 2), max(1, limit // 3)


def _ids(engine: Engine, rng: np.random.Generator, batch: int, length: int) -> np.ndarray:
    return rng.integers(3, engine.card["vocab_size"], (batch, length), dtype=np.int64)


def _left_padding(batch: int, length: int) -> np.ndarray:
    """Row r has r * length // 4 leading pads; row 0 none."""
    mask = np.ones((batch, length), np.int64)
    for row in range(batch):
        mask[row, : row * length // 4] = 0
    return mask


def _decoder_cases(engine: Engine, rng: np.random.Generator) -> list[Case]:
    card = engine.card
    limit = card["max_positions"]
    middle, past = _lengths(limit)
    inputs = past_names(card["n_layers"], "past_key_values")
    outputs = past_names(card["n_layers"], "present")
    cases = []
    for batch, length, past_length, padded in (
        (1, 1, 0, False), (3, middle, 0, False), (1, limit, 0, False), (3, middle, 0, True),
        (1, 1, past, False), (3, 1, past, True), (3, limit - past, past, True),
    ):
        total = past_length + length
        mask = _left_padding(batch, total) if padded else np.ones((batch, total), np.int64)
        positions = np.clip(np.cumsum(mask, axis=1) - 1, 0, None)
        cache = empty_past(engine, batch)
        if past_length:  # a real cache: the reference run over a prefix
            prefix = engine.run("model.onnx", {
                "input_ids": _ids(engine, rng, batch, past_length),
                "attention_mask": mask[:, :past_length], "position_ids": positions[:, :past_length],
                **dict(zip(inputs, cache, strict=True))})
            cache = [prefix[name] for name in outputs]
        name = f"b{batch} s{length} past{past_length}" + (" padded" if padded else "")
        cases.append(Case(name, "model.onnx", {
            "input_ids": _ids(engine, rng, batch, length), "attention_mask": mask,
            "position_ids": positions[:, past_length:], **dict(zip(inputs, cache, strict=True))}))
    return cases


def _right_padding(batch: int, length: int) -> np.ndarray:
    mask = np.ones((batch, length), np.int64)
    for row in range(1, batch):
        mask[row, length - row * length // 4:] = 0
    return mask


def _encoder_cases(engine: Engine, rng: np.random.Generator, file: str) -> list[Case]:
    limit = engine.card["max_positions"]
    middle, _ = _lengths(limit)
    cases = []
    for batch, length, padded in ((1, 1, False), (3, middle, False), (1, limit, False),
                                  (3, middle, True)):
        mask = _right_padding(batch, length) if padded else np.ones((batch, length), np.int64)
        feeds = {"input_ids": _ids(engine, rng, batch, length), "attention_mask": mask}
        if file == "model.onnx" and engine.card["type_vocab_size"]:
            feeds["token_type_ids"] = rng.integers(0, engine.card["type_vocab_size"],
                                                   (batch, length), dtype=np.int64)
        name = f"b{batch} s{length}" + (" padded" if padded else "")
        cases.append(Case(name, file, feeds))
    return cases


def _seq2seq_decoder_cases(engine: Engine, rng: np.random.Generator) -> list[Case]:
    card = engine.card
    limit = card["max_positions"]
    middle, past = _lengths(limit)
    inputs = past_names(card["n_layers"], "past_key_values", ".decoder")
    outputs = past_names(card["n_layers"], "present", ".decoder")
    cases = []
    for batch, length, past_length, padded in (
        (1, 1, 0, False), (3, middle, 0, True), (1, limit, 0, False), (3, 1, past, True),
        (1, limit - past, past, False),
    ):
        source_mask = _right_padding(batch, middle) if padded else np.ones((batch, middle),
                                                                           np.int64)
        memory = engine.run("encoder.onnx", {"input_ids": _ids(engine, rng, batch, middle),
                                             "attention_mask": source_mask})["last_hidden_state"]
        shared = {"encoder_hidden_states": memory, "encoder_attention_mask": source_mask}
        cache = empty_past(engine, batch)
        if past_length:
            prefix = engine.run("decoder.onnx", {
                "input_ids": _ids(engine, rng, batch, past_length), **shared,
                **dict(zip(inputs, cache, strict=True))})
            cache = [prefix[name] for name in outputs]
        name = f"b{batch} s{length} past{past_length}" + (" src-padded" if padded else "")
        cases.append(Case(name, "decoder.onnx", {
            "input_ids": _ids(engine, rng, batch, length), **shared,
            **dict(zip(inputs, cache, strict=True))}))
    return cases


def shape_grid(reference: Engine, seed: int = 0) -> list[Case]:
    """The cases, with any cache and encoder memory computed by the reference engine."""
    rng = np.random.default_rng(seed)
    family = reference.card.family
    if family == "decoder":
        return _decoder_cases(reference, rng)
    if family == "encoder":
        return _encoder_cases(reference, rng, "model.onnx")
    return _encoder_cases(reference, rng, "encoder.onnx") + _seq2seq_decoder_cases(reference, rng)


def compare(expected: np.ndarray, actual: np.ndarray, atol: float, rtol: float
            ) -> tuple[float, float, bool]:
    if expected.shape != actual.shape:
        return float("inf"), float("inf"), False
    difference = np.abs(actual.astype(np.float64) - expected.astype(np.float64))
    if difference.size == 0:
        return 0.0, 0.0, True
    # Relative to |expected| + atol, so that elements near zero do not dominate the figure.
    relative = difference / (np.abs(expected) + atol)
    passed = bool(np.all(difference <= atol + rtol * np.abs(expected)))
    return float(difference.max()), float(relative.max()), passed


def check_parity(reference: Engine, candidate: Engine, atol: float = DEFAULT_ATOL,
                 rtol: float = DEFAULT_RTOL, generation_steps: int = GENERATION_STEPS,
                 seed: int = 0) -> Report:
    report = Report()
    for case in shape_grid(reference, seed):
        expected = reference.run(case.file, case.feeds)
        actual = candidate.run(case.file, case.feeds)
        grouped: dict[str, Row] = {}
        for output, value in expected.items():
            max_abs, max_rel, passed = compare(value, actual[output], atol, rtol)
            label = CACHE_OUTPUT.sub(r"\1.*", output)  # one row for all layers' cache
            if case.file != "model.onnx":
                label = f"{case.file[:-5]}:{label}"
            row = grouped.setdefault(label, Row(label, case.name, 0.0, 0.0, True))
            row.max_abs, row.max_rel = max(row.max_abs, max_abs), max(row.max_rel, max_rel)
            row.passed = row.passed and passed
        report.rows.extend(grouped.values())
    if reference.card.family != "encoder" and generation_steps:
        rng = np.random.default_rng(seed)
        card = reference.card
        steps = min(generation_steps, card["max_positions"] - 4)
        prompt = _ids(reference, rng, 2, 4)
        mask = _left_padding(2, 4)
        same = np.array_equal(generate(reference, prompt, mask, steps),
                              generate(candidate, prompt, mask, steps))
        report.generation.append(("batch 2, left-padded", same, steps))
    return report
