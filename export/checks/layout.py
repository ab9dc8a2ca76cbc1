"""The clients' seq2seq layout (manifest `layout`, export/targets/seq2seq_layout.py) against the
export's own graphs, in the same ONNX Runtime: the encoder's memory; the merged decoder's first
step (use_cache_branch false: it projects the memory to the cross cache itself) against
encoder.onnx's cross cache and decoder.onnx over an empty self cache; a later step (true)
against decoder.onnx given the same caches; and the greedy tokens of the clients' loop
(LayoutSeq2SeqSession) against `zoo run`'s. The contract graphs are what the parity grid or the
agreement check proved; this proves the layout computes what they compute, whatever variant
(--optimize, --quantize) they are."""

from __future__ import annotations

import re
from collections.abc import Callable

import numpy as np

from export.checks.cases import left_padding, random_ids, right_padding
from export.checks.parity import DEFAULT_ATOL, DEFAULT_RTOL, GENERATION_STEPS, Report, Row, compare
from registry.schema import target_vocab_size
from runtime.contract import (
    CACHE_INPUT,
    CACHE_OUTPUT,
    DECODER,
    ENCODER,
    LAYOUT_DECODER,
    LAYOUT_ENCODER,
    USE_CACHE_BRANCH,
    past_names,
)
from runtime.decoding import LayoutSeq2SeqSession, Seq2SeqSession, empty_past
from runtime.sampling import Sampling, decode
from runtime.sessions import Runtime

PER_LAYER = re.compile(r"\.\d+\.(decoder|encoder)\.(key|value)$")  # present.{i}.decoder.key


def rows_of(case: str, expected: dict[str, np.ndarray], actual: dict[str, np.ndarray],
          names: list[str], atol: float, rtol: float) -> list[Row]:
    """One row per output, the layers' caches of a kind in one (as the parity table has them)."""
    rows: dict[str, Row] = {}
    for name in names:
        label = "layout:" + PER_LAYER.sub(r".*.\1.*", name)
        max_abs, max_rel, passed = compare(expected[name], actual[name], atol, rtol)
        row = rows.setdefault(label, Row(label, case, 0.0, 0.0, True))
        row.max_abs, row.max_rel = max(row.max_abs, max_abs), max(row.max_rel, max_rel)
        row.passed = row.passed and passed
    return list(rows.values())


def step_rows(runtime: Runtime, case: str, encoder_feeds: dict[str, np.ndarray],
              source_feeds: dict[str, np.ndarray], draw_ids: Callable[[int], np.ndarray],
              target: int, atol: float, rtol: float) -> list[Row]:
    """One batch of sources through both: the layout's encoder against encoder.onnx, the merged
    decoder's first step (`target` ids) and a later one (one id) against decoder.onnx given the
    same caches. `source_feeds`: what the decoder reads of the source besides (a text's mask;
    nothing for Whisper's frames); `draw_ids(length)`: random target ids (batch, length)."""
    n = runtime.card["n_layers"]
    self_in, self_out = past_names(n, CACHE_INPUT, DECODER), past_names(n, CACHE_OUTPUT, DECODER)
    cross_in, cross_out = past_names(n, CACHE_INPUT, ENCODER), past_names(n, CACHE_OUTPUT, ENCODER)
    encoded = runtime.run("encoder.onnx", encoder_feeds)
    memory = runtime.run(LAYOUT_ENCODER, encoder_feeds)
    rows = rows_of(case, encoded, memory, ["last_hidden_state"], atol, rtol)
    batch = len(memory["last_hidden_state"])
    hidden = {"encoder_hidden_states": memory["last_hidden_state"], **source_feeds}
    cross = {name: encoded[out] for name, out in zip(cross_in, cross_out, strict=True)}
    empty = dict(zip(self_in, empty_past(runtime, batch), strict=True))
    ids = draw_ids(target)
    first = runtime.run(LAYOUT_DECODER, {
        "input_ids": ids, **hidden, USE_CACHE_BRANCH: np.array([False]), **empty,
        **dict(zip(cross_in, empty_past(runtime, batch), strict=True))})
    expected = runtime.run("decoder.onnx", {"input_ids": ids, **source_feeds, **empty, **cross})
    expected.update(encoded)  # the cross cache the first step returns: encoder.onnx's
    rows += rows_of(f"first {case}", expected, first, ["logits", *self_out, *cross_out], atol,
                    rtol)
    past = {name: expected[out] for name, out in zip(self_in, self_out, strict=True)}
    ids = draw_ids(1)
    later = runtime.run(LAYOUT_DECODER, {
        "input_ids": ids, **hidden, USE_CACHE_BRANCH: np.array([True]), **past, **cross})
    expected = runtime.run("decoder.onnx", {"input_ids": ids, **source_feeds, **past, **cross})
    return rows + rows_of(f"later {case}", expected, later, ["logits", *self_out], atol, rtol)


def check_layout(runtime: Runtime, atol: float = DEFAULT_ATOL, rtol: float = DEFAULT_RTOL,
                 steps: int = GENERATION_STEPS, seed: int = 0) -> Report:
    card = runtime.card
    rng = np.random.default_rng(seed)
    middle = max(2, min(card["max_positions"], 16) // 2)
    report = Report()
    for batch, source, target, padded in ((1, 1, 1, False), (3, middle, 3, True)):
        case = f"b{batch} src{source} s{target}" + (" padded" if padded else "")
        mask = right_padding(batch, source) if padded else np.ones((batch, source), np.int64)
        encoder_feeds = {"input_ids": random_ids(runtime, rng, batch, source),
                         "attention_mask": mask}
        report.rows += step_rows(
            runtime, case, encoder_feeds, {"encoder_attention_mask": mask},
            lambda length, batch=batch: random_ids(runtime, rng, batch, length,
                                                   target_vocab_size(card)),
            target, atol, rtol)
    steps = min(steps, card["max_positions"] - 1)
    prompt = random_ids(runtime, rng, 2, 6)
    mask = left_padding(2, 6)
    tokens = [decode(session, prompt, mask, steps, Sampling(), None)
              for session in (Seq2SeqSession(runtime), LayoutSeq2SeqSession(runtime))]
    report.generation.append(("seq2seq layout's loop vs decoder.onnx's", bool(
        np.array_equal(*tokens)), steps))
    return report
