"""Whisper's clients' layout against the export's own graphs (checks/layout.py's check, its
sources log-mel frames and no masks): the encoder's memory; the merged decoder's first step
(it projects the memory to the cross cache itself) against encoder.onnx's cross cache and
decoder.onnx over an empty self cache; a later step against decoder.onnx given the same
caches; and the greedy tokens of the clients' loop (LayoutSpeechSession) against the export's
own (SpeechSession)."""

from __future__ import annotations

import numpy as np

from export.checks.layout import rows_of
from export.checks.parity import DEFAULT_ATOL, DEFAULT_RTOL, GENERATION_STEPS, Report
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
from runtime.decoding import empty_past
from runtime.sessions import Runtime
from runtime.speech_sessions import (
    SPEECH_DECODER,
    SPEECH_ENCODER,
    LayoutSpeechSession,
    SpeechSession,
    greedy_tokens,
)


def _frames(rng: np.random.Generator, runtime: Runtime, batch: int, length: int) -> np.ndarray:
    return rng.standard_normal((batch, runtime.card["n_mels"], length)).astype(np.float32)


def check_speech_layout(runtime: Runtime, atol: float = DEFAULT_ATOL,
                        rtol: float = DEFAULT_RTOL, steps: int = GENERATION_STEPS,
                        seed: int = 0) -> Report:
    card = runtime.card
    n, vocab = card["n_layers"], card["vocab_size"]
    rng = np.random.default_rng(seed)
    self_in, self_out = past_names(n, CACHE_INPUT, DECODER), past_names(n, CACHE_OUTPUT, DECODER)
    cross_in, cross_out = past_names(n, CACHE_INPUT, ENCODER), past_names(n, CACHE_OUTPUT, ENCODER)
    full = 2 * card["max_source_positions"]
    report = Report()
    for batch, length, target in ((1, full, 1), (2, min(full, 32), 3)):
        case = f"b{batch} frames{length} s{target}"
        features = {"input_features": _frames(rng, runtime, batch, length)}
        encoded = runtime.run(SPEECH_ENCODER, features)
        memory = runtime.run(LAYOUT_ENCODER, features)
        report.rows += rows_of(case, encoded, memory, ["last_hidden_state"], atol, rtol)
        cross = {name: encoded[out] for name, out in zip(cross_in, cross_out, strict=True)}
        empty = dict(zip(self_in, empty_past(runtime, batch), strict=True))
        ids = rng.integers(0, vocab, (batch, target), dtype=np.int64)
        first = runtime.run(LAYOUT_DECODER, {
            "input_ids": ids, "encoder_hidden_states": memory["last_hidden_state"],
            USE_CACHE_BRANCH: np.array([False]), **empty,
            **dict(zip(cross_in, empty_past(runtime, batch), strict=True))})
        expected = runtime.run(SPEECH_DECODER, {"input_ids": ids, **empty, **cross})
        expected.update(encoded)  # the cross cache the first step returns: encoder.onnx's
        report.rows += rows_of(f"first {case}", expected, first,
                               ["logits", *self_out, *cross_out], atol, rtol)
        past = {name: expected[out] for name, out in zip(self_in, self_out, strict=True)}
        ids = rng.integers(0, vocab, (batch, 1), dtype=np.int64)
        later = runtime.run(LAYOUT_DECODER, {
            "input_ids": ids, "encoder_hidden_states": memory["last_hidden_state"],
            USE_CACHE_BRANCH: np.array([True]), **past, **cross})
        expected = runtime.run(SPEECH_DECODER, {"input_ids": ids, **past, **cross})
        report.rows += rows_of(f"later {case}", expected, later, ["logits", *self_out], atol,
                               rtol)
    steps = min(steps, card["max_positions"] - 1)
    features = _frames(rng, runtime, 2, full)
    tokens = [greedy_tokens(session, features, card["bos_token_id"], steps)
              for session in (SpeechSession(runtime), LayoutSpeechSession(runtime))]
    report.generation.append(("seq2seq layout's loop vs decoder.onnx's", bool(
        np.array_equal(*tokens)), steps))
    return report
