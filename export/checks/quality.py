"""The gate an --quantize int8-dynamic export passes instead of the fp32 parity grid: figures
of what the export is for, measured against fp32 PyTorch on a batch of sequences of mixed
length (right-padded, as `zoo embed` and `zoo classify` run them): passages of the shipped
text where the export has a tokenizer, else random ids.

- a sentence vector (`pooling`): every row's cosine to fp32, raw and centered (less the fp32
  batch mean);
- a classifier (`num_labels`): label agreement, and the largest change of a probability;
- an MLM head: top-1 agreement and top-5 containment at every real position;
- hidden states alone: every real position's cosine to fp32;
- an encoder-decoder (only its encoder quantized): the generation agreement of weight-only
  int8 (export/checks/agreement.py), along the fp32 model's greedy continuation.

Measured on random weights (tiny cards, tests; bert-base's shape) and on the packaged
all-MiniLM-L6-v2 (BENCHMARKS.md); the thresholds sit below those with room, and a broken
quantization (a mis-scaled or transposed weight) falls far below them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from export.checks.agreement import THRESHOLDS, Agreement
from registry.errors import ZooError
from runtime.classify import cosines, right_padded, softmax
from runtime.encode import encoder_feeds
from runtime.engine import Engine
from runtime.files.texts import TextRow
from runtime.files.tokenizer import Tokenizer, sequence_ids
from zoo.training.data import SHIPPED_TEXT

ROWS = 16
LENGTHS = (4, 64)  # shortest and longest row, capped by max_positions
# int8-dynamic's calibration (export/onnx/smoothing.py): 64 passages from the shipped text's
# 4000th non-empty line on (of 9023): the gate reads the first 112, BENCHMARKS.md's 50 lines
# lie in the first 2000.
CALIBRATION_ROWS, CALIBRATION_LINE, CALIBRATION_SEED = 64, 4000, 1_000_003
# --calibration FILE: its rows as they are, cut to this many tokens (64 rows of 128 cost a
# bert-base's calibration seconds); fewer rows than this are too few to find the outliers by.
CALIBRATION_LONGEST, MIN_CALIBRATION_ROWS = 128, 8
# Sentence vectors and hidden states: the target. The real all-MiniLM-L6-v2 measured
# 0.9986 on the gate's passages (up to 64 tokens) and 0.995 at worst over 50 single lines of
# the shipped text in one batch (BENCHMARKS.md; 0.9905 and 0.974 before smoothing.py's
# rewrites); Optimum's own int8 export of it 0.965 on those lines.
MIN_COSINE = 0.99
# The vectors less their fp32 mean over the batch: what tells the rows apart. Mean-pooled
# random-weight vectors share one large direction, so a quantization with every weight
# shuffled still kept a cosine of 0.9957 (bert-tiny); its centered cosine fell to 0.82.
MIN_CENTERED_COSINE = 0.95
MIN_LABEL_AGREEMENT = 0.9
MAX_PROBABILITY_CHANGE = 0.05


@dataclass(frozen=True)
class Measure:
    """One gated figure: `value` must be >= `threshold` (or <= where `at_most`)."""

    what: str
    figure: str
    value: float
    threshold: float
    at_most: bool = False

    @property
    def passed(self) -> bool:
        return self.value <= self.threshold if self.at_most else self.value >= self.threshold

    def line(self) -> str:
        sign = "<=" if self.at_most else ">="
        return f"{self.what} {self.figure} {self.value:.5f} (needs {sign} {self.threshold:g})"


@dataclass
class GateReport:
    quantization: str
    rows: list[Measure] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        return bool(self.rows) and all(row.passed for row in self.rows)

    def table(self) -> str:
        lines = [f"{'check':<44} {'figure':<22} {'value':>9} {'gate':>10} pass"]
        for row in self.rows:
            gate = f"{'<=' if row.at_most else '>='} {row.threshold:g}"
            lines.append(f"{row.what:<44} {row.figure:<22} {row.value:>9.5f} {gate:>10} "
                         f"{'yes' if row.passed else 'NO'}")
        verdict = "PASSED" if self.passed else "FAILED"
        lines.append(f"quality gate ({self.quantization} vs fp32): {verdict}")
        return "\n".join(lines)

    def as_dict(self) -> dict[str, Any]:
        return {"passed": self.passed,
                "checks": [{"what": r.what, "figure": r.figure, "value": r.value,
                            "threshold": r.threshold, "at_most": r.at_most, "passed": r.passed}
                           for r in self.rows]}


class GateError(ZooError):
    """Below the gate: every failing figure in one line; nothing was written."""

    def __init__(self, report: GateReport) -> None:
        failing = "; ".join(row.line() for row in report.rows if not row.passed)
        super().__init__(f"{report.quantization} export below the quality gate: "
                         f"{failing or 'nothing was measured'}; nothing written")
        self.report = report


def mixed_batch(card: Any, seed: int, tokenizer: Tokenizer | None = None, rows: int = ROWS,
                first_line: int = 0) -> dict[str, np.ndarray]:
    """`rows` sequences of lengths spread over LENGTHS, right-padded with their mask: passages
    of seven lines of the shipped text from `first_line` on, read by the export's tokenizer
    where it has one (real text is what the export is for: random ids put the real
    all-MiniLM-L6-v2's int8 at 0.985, passages at 0.9905), else random ids."""
    longest = min(LENGTHS[1], card["max_positions"])
    lengths = np.linspace(min(LENGTHS[0], longest), longest, rows).round().astype(int)
    pad = card["pad_token_id"] if card["pad_token_id"] is not None else 0
    if tokenizer is not None:
        lines = [line for line in SHIPPED_TEXT.read_text(encoding="utf-8").splitlines()
                 if line.strip()][first_line:]
        prompts = [sequence_ids(tokenizer, " ".join(lines[7 * row:7 * row + 7]))[:length]
                   for row, length in enumerate(lengths)]
    else:
        rng = np.random.default_rng(seed)
        prompts = [[3 if token == pad else token
                    for token in rng.integers(3, card["vocab_size"], length).tolist()]
                   for length in lengths]
    ids, mask = right_padded(prompts, pad)
    return encoder_feeds(card, ids, mask)


def calibration_batch(card: Any, tokenizer: Tokenizer | None,
                      texts: list[TextRow] | None = None, where: str = ""
                      ) -> dict[str, np.ndarray]:
    """What int8-dynamic's smoothing measures its activations on: other text than the gate's
    (passages from CALIBRATION_LINE on; random ids from another seed), or the user's `texts`
    (from the file `where`; --calibration): CALIBRATION_ROWS of them spread evenly over the
    file, each cut to CALIBRATION_LONGEST tokens."""
    if texts is None:
        return mixed_batch(card, CALIBRATION_SEED, tokenizer, CALIBRATION_ROWS, CALIBRATION_LINE)
    if len(texts) < MIN_CALIBRATION_ROWS:
        raise ZooError(f"{where}: {len(texts)} rows; calibration needs at least "
                       f"{MIN_CALIBRATION_ROWS}")
    if tokenizer is None:
        raise ZooError(f"{where}: --calibration needs the export's tokenizer to read it, and "
                       "this model has none (it calibrates on random ids without the option)")
    picked = np.linspace(0, len(texts) - 1, min(CALIBRATION_ROWS, len(texts))).round()
    longest = min(CALIBRATION_LONGEST, card["max_positions"])
    prompts = []
    for row in (texts[int(index)] for index in picked):
        ids = sequence_ids(tokenizer, row.text)[:longest]
        if not ids:
            raise ZooError(f"{where}:{row.line}: the text has no tokens")
        prompts.append(ids)
    pad = card["pad_token_id"] if card["pad_token_id"] is not None else 0
    ids, mask = right_padded(prompts, pad)
    return encoder_feeds(card, ids, mask)


def encoder_quality(reference: Engine, candidate: Engine, file: str, seed: int,
                    tokenizer: Tokenizer | None = None) -> list[Measure]:
    """The figures for what this card's graph is for (see the module docstring)."""
    card = reference.card
    feeds = mixed_batch(card, seed, tokenizer)
    expected, actual = reference.run(file, feeds), candidate.run(file, feeds)
    real = feeds["attention_mask"].astype(bool)
    rows = f"{ROWS} rows"
    measures = []
    if "sentence_embedding" in expected:
        e, a = expected["sentence_embedding"], actual["sentence_embedding"]
        centre = e.mean(axis=0)  # the direction every vector shares (large when untrained)
        measures += [Measure(f"sentence_embedding, {rows}", "min cosine",
                             float(cosines(e, a).min()), MIN_COSINE),
                     Measure(f"sentence_embedding, {rows}", "min centered cosine",
                             float(cosines(e - centre, a - centre).min()), MIN_CENTERED_COSINE)]
    if card["pooling"] is not None and card["num_labels"]:
        p, q = softmax(expected["logits"]), softmax(actual["logits"])
        agree = float((p.argmax(-1) == q.argmax(-1)).mean())
        measures += [Measure(f"classifier labels, {rows}", "label agreement", agree,
                             MIN_LABEL_AGREEMENT),
                     Measure(f"classifier probabilities, {rows}", "max probability change",
                             float(np.abs(p - q).max()), MAX_PROBABILITY_CHANGE, at_most=True)]
    elif "logits" in expected:  # the MLM head: (batch, sequence, vocab) at the real positions
        e, a = expected["logits"][real], actual["logits"][real]
        top1 = e.argmax(-1)
        best5 = np.argpartition(-a, min(5, a.shape[-1] - 1), axis=-1)[:, :5]
        top1_rate, top5_rate = THRESHOLDS["int8"]
        what = f"MLM, {int(real.sum())} positions"
        measures += [Measure(what, "top-1 agreement", float((a.argmax(-1) == top1).mean()),
                             top1_rate),
                     Measure(what, "in top-5", float((best5 == top1[:, None]).any(-1).mean()),
                             top5_rate)]
    if not measures:
        cos = cosines(expected["last_hidden_state"][real], actual["last_hidden_state"][real])
        measures.append(Measure(f"last_hidden_state, {int(real.sum())} positions",
                                "min cosine", float(cos.min()), MIN_COSINE))
    return measures


def agreement_measures(agreement: Agreement) -> list[Measure]:
    """A generation agreement (the encoder-decoder's) as gated figures, int8's thresholds."""
    top1, top5 = THRESHOLDS["int8"]
    return [Measure(agreement.what, "top-1 agreement", agreement.rate, top1),
            Measure(agreement.what, "in top-5", agreement.top5_rate, top5)]
