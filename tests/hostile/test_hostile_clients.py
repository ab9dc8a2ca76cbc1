"""Issue 37's findings 11 and 12 (finding 10, a MarianMT export's decoded text in the other
clients, is in tests/imports/test_marian.py, beside its export).

11. `zoo export --optimize` of a decoder whose head size ONNX Runtime's GroupQueryAttention
    refuses (model_kv.onnx's attention) was ORT's own error after minutes, then (issue 37) a
    refusal before any tracing; now (issue 49) the export is made without the shared-cache
    graph, its other fusions kept, the manifest saying why; the sizes left without one are the
    ones ORT itself refuses, run here (tests/export/test_gqa_rules.py: every rule).
12. The int8-dynamic quality gate, fed figures that fail one criterion alone (every other
    passing), refuses; figures just over every threshold pass. The thresholds are the stated
    ones, not the code's constants: sentence cosine >= 0.99 (docs/reference.md, the issue),
    top-1 agreement >= 0.90 and top-5 containment >= 0.98 (int8, BENCHMARKS.md). The docs
    name the other figures without values: those below are the gate's as shipped (centered
    cosine >= 0.95, label agreement >= 0.9, probability change <= 0.05).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

import export.families.decoder
import export.onnx.writer
from export.checks.agreement import Agreement
from export.checks.quality import GateError, GateReport, agreement_measures, encoder_quality
from export.families import family_of
from runtime.contract import MODEL_GRAPH
from tests.conftest import BERT_CLASSIFIER, card
from tests.support.gqa import gqa_accepts

MIN_COSINE, MIN_CENTERED, MIN_LABELS, MAX_CHANGE, MIN_TOP1, MIN_TOP5 = (
    0.99, 0.95, 0.9, 0.05, 0.90, 0.98)
JUST = 1e-4  # how far under or over a threshold a figure is put


# --- 11. --optimize and GroupQueryAttention's head size ---------------------------------------

def gqa_runs(head_size: int, heads: int = 2) -> bool:
    """Does ONNX Runtime's CPU GroupQueryAttention run one prefill of this head size (no
    rotary in the kernel: gpt-tiny's positions are learned)?"""
    return gqa_accepts(head_size, False, 3, 0, heads=heads, kv_heads=heads)


@pytest.mark.parametrize("head_size", [4, 8, 12, 16, 20, 24])
def test_optimize_keeps_the_shared_cache_graph_exactly_where_onnx_runtime_runs_it(
        head_size: int) -> None:
    decoder = card("gpt-tiny", d_model=4 * head_size, n_heads=4)
    assert family_of(decoder).attention_plan(decoder).runs == gqa_runs(head_size)


def test_optimize_with_a_head_size_gqa_refuses_exports_without_the_shared_cache_graph(
        tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """Head size 12: the contract graph, fused and parity-checked, generating as a plain
    export does; no model_kv.onnx, and the manifest and the progress say why."""
    import json

    from tests.support.helpers import zoo

    def traced_kv(*args: object, **kwargs: object) -> None:
        raise AssertionError("the shared-cache graph was traced")

    monkeypatch.setattr(export.families.decoder, "export_graph", traced_kv)
    out = tmp_path / "out"
    result = zoo("export", "gpt-tiny", "--onnx", "--optimize", "--set=d_model=48",
                 "--set=n_heads=4", "-o", out)
    assert result.exit_code == 0, result.output
    assert "no onnx/model_kv.onnx: head size 12 is not a multiple of 8" in result.output
    manifest = json.loads((out / "manifest.json").read_text())
    assert "generation" not in manifest and not (out / "onnx" / "model_kv.onnx").exists()
    assert manifest["attention"]["onnx/model_kv.onnx"] == (
        "not made: head size 12 is not a multiple of 8, which GroupQueryAttention needs")
    assert manifest["optimization"]  # the fusions ran on the contract graph


# --- 12. the int8-dynamic quality gate, one criterion at a time --------------------------------

class Fixed:
    """An engine whose outputs are made from the feeds the gate gives it (their mask)."""

    def __init__(self, model_card: Any, outputs: Callable[[np.ndarray], dict[str, np.ndarray]]
                 ) -> None:
        self.card = model_card
        self.outputs = outputs

    def run(self, file: str, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        assert file == MODEL_GRAPH
        return self.outputs(feeds["attention_mask"].astype(bool))


def gate(model_card: Any, expected: Callable, actual: Callable) -> GateReport:
    return GateReport("int8-dynamic", encoder_quality(
        Fixed(model_card, expected), Fixed(model_card, actual), MODEL_GRAPH, seed=0))


def failing(report: GateReport) -> set[str]:
    return {row.figure for row in report.rows if not row.passed}


def assert_refused_for(report: GateReport, figure: str) -> None:
    assert failing(report) == {figure}, report.table()
    assert not report.passed
    assert figure in str(GateError(report))


def unit(index: int, width: int = 40) -> np.ndarray:
    vector = np.zeros(width)
    vector[index] = 1.0
    return vector


def vectors(rows: int, common: float, cosine: float) -> tuple[np.ndarray, np.ndarray]:
    """(fp32, int8) rows: each fp32 row a shared direction (`common` long) plus a part of its
    own that sums to zero over the rows, so the batch mean is the shared direction; int8 equals
    fp32 but in row 0, turned off its own part so that its centered cosine is `cosine`."""
    own = [unit(row // 2) * (1 if row % 2 == 0 else -1) for row in range(rows)]
    expected = np.stack([common * unit(30) + part for part in own])
    actual = expected.copy()
    actual[0] += np.sqrt(1 / cosine**2 - 1) * unit(31)
    return expected, actual


def embedder_gate(common: float, cosine: float) -> GateReport:
    embedder = card("bert-tiny", pooling="mean")
    return gate(embedder, lambda mask: {"sentence_embedding": vectors(len(mask), common,
                                                                      cosine)[0]},
                lambda mask: {"sentence_embedding": vectors(len(mask), common, cosine)[1]})


def test_the_sentence_cosine_alone_just_under_099_is_refused() -> None:
    """No shared direction: the centered cosine is the raw one, 0.9899, well over 0.95."""
    assert_refused_for(embedder_gate(0.0, MIN_COSINE - JUST), "min cosine")
    assert embedder_gate(0.0, MIN_COSINE + JUST).passed


def test_the_centered_cosine_alone_just_under_its_threshold_is_refused() -> None:
    """A long shared direction keeps the raw cosine near 1 (0.9995) while the row's own part
    turns by arccos(0.9499)."""
    report = embedder_gate(10.0, MIN_CENTERED - JUST)
    assert_refused_for(report, "min centered cosine")
    assert next(row.value for row in report.rows if row.figure == "min cosine") > MIN_COSINE
    assert embedder_gate(10.0, MIN_CENTERED + JUST).passed


def probabilities(rows: int, flipped: int, change: float) -> tuple[np.ndarray, np.ndarray]:
    """Three labels' logits: fp32 [0.6, 0.3, 0.1], in row 0 moved by `change` (the label kept);
    the last `flipped` rows a near tie [0.45, 0.44, 0.11] that int8 reverses (a change of
    0.01)."""
    p = np.tile([0.6, 0.3, 0.1], (rows, 1))
    q = p.copy()
    q[0] += [-change, change, 0.0]
    for row in range(rows - flipped, rows):
        p[row], q[row] = [0.45, 0.44, 0.11], [0.44, 0.45, 0.11]
    return np.log(p), np.log(q)


def classifier_gate(flipped: int, change: float) -> GateReport:
    classifier = card("bert-tiny", **BERT_CLASSIFIER)
    same = lambda mask: vectors(len(mask), 0.0, 1.0)[0]  # noqa: E731 (its vectors pass)
    return gate(classifier, lambda mask: {"sentence_embedding": same(mask), "logits":
                                          probabilities(len(mask), flipped, change)[0]},
                lambda mask: {"sentence_embedding": same(mask), "logits":
                              probabilities(len(mask), flipped, change)[1]})


def test_label_agreement_alone_under_its_threshold_is_refused() -> None:
    """16 rows: two labels changed is 0.875, one 0.9375 (the nearest under and over 0.9)."""
    assert_refused_for(classifier_gate(2, 0.0), "label agreement")
    assert classifier_gate(1, 0.0).passed


def test_a_probability_change_alone_just_over_its_threshold_is_refused() -> None:
    assert_refused_for(classifier_gate(0, MAX_CHANGE + JUST), "max probability change")
    assert classifier_gate(1, MAX_CHANGE - JUST).passed


def mlm_logits(mask: np.ndarray, misses: int, out_of_top5: bool) -> np.ndarray:
    """(batch, sequence, 10) logits, token 0 best at every position; `misses` real positions
    (the first ones) with token 0 second (`out_of_top5`: last) in int8's, others unchanged."""
    logits = np.broadcast_to(np.arange(10.0)[::-1], (*mask.shape, 10)).copy()
    for row, column in list(zip(*np.nonzero(mask), strict=True))[:misses]:
        if out_of_top5:
            logits[row, column, 0] = -100.0
        else:
            logits[row, column, :2] = logits[row, column, 1::-1]
    return logits


def mlm_gate(misses: Callable[[int], int], out_of_top5: bool) -> GateReport:
    """bert-tiny with its MLM head; `misses(real positions)`: how many int8 gets wrong."""
    mlm = card("bert-tiny")
    return gate(mlm, lambda mask: {"logits": mlm_logits(mask, 0, False)},
                lambda mask: {"logits": mlm_logits(mask, misses(int(mask.sum())), out_of_top5)})


def most_at(rate: float) -> Callable[[int], int]:
    """The most misses of n positions that keep the share at or over `rate` (rounded first:
    (1 - 0.9) * 540 is 53.999...)."""
    return lambda n: int(np.floor(round((1 - rate) * n, 9)))


def fewest_under(rate: float) -> Callable[[int], int]:
    """The fewest misses of n positions that put the share right under `rate`."""
    return lambda n: most_at(rate)(n) + 1


def test_mlm_top1_alone_just_under_its_threshold_is_refused() -> None:
    """The fp32 token second in int8's ranking: still in its top 5."""
    assert_refused_for(mlm_gate(fewest_under(MIN_TOP1), False), "top-1 agreement")
    assert mlm_gate(most_at(MIN_TOP1), False).passed


def test_mlm_top5_alone_just_under_its_threshold_is_refused() -> None:
    """The fp32 token last in int8's ranking, at under 10% of positions: top-1 passes."""
    assert_refused_for(mlm_gate(fewest_under(MIN_TOP5), True), "in top-5")
    assert mlm_gate(most_at(MIN_TOP5), True).passed


def hidden_states(mask: np.ndarray, cosine: float) -> np.ndarray:
    """(batch, sequence, 40): unit(0) everywhere, the first real position turned to `cosine`."""
    states = np.broadcast_to(unit(0), (*mask.shape, 40)).copy()
    row, column = next(zip(*np.nonzero(mask), strict=True))
    states[row, column] = cosine * unit(0) + np.sqrt(1 - cosine**2) * unit(1)
    return states


def test_hidden_states_cosine_alone_just_under_099_is_refused() -> None:
    """An encoder without a pooling or a head: its last_hidden_state at every real position."""
    plain = card("bert-tiny", mlm_head=False)

    def hidden_gate(cosine: float) -> GateReport:
        return gate(plain, lambda mask: {"last_hidden_state": hidden_states(mask, 1.0)},
                    lambda mask: {"last_hidden_state": hidden_states(mask, cosine)})

    assert_refused_for(hidden_gate(MIN_COSINE - JUST), "min cosine")
    assert hidden_gate(MIN_COSINE + JUST).passed


@pytest.mark.parametrize("agreeing, within_top5, figure", [
    (899, 1000, "top-1 agreement"), (1000, 979, "in top-5"), (900, 980, None)])
def test_an_encoder_decoders_generation_agreement_is_gated_at_int8s_rates(
        agreeing: int, within_top5: int, figure: str | None) -> None:
    report = GateReport("int8-dynamic", agreement_measures(
        Agreement("generation, 1000 positions", 1000, agreeing, within_top5, 0.5)))
    if figure is None:
        assert report.passed, report.table()
    else:
        assert_refused_for(report, figure)


def test_a_gate_that_measured_nothing_refuses() -> None:
    report = GateReport("int8-dynamic")
    assert not report.passed and "nothing was measured" in str(GateError(report))
