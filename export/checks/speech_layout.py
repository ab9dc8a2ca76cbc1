"""Whisper's clients' layout against the export's own graphs (checks/layout.py's check, its
sources log-mel frames and no masks): the encoder's memory; the merged decoder's first step
(it projects the memory to the cross cache itself) against encoder.onnx's cross cache and
decoder.onnx over an empty self cache; a later step against decoder.onnx given the same
caches; and the greedy tokens of the clients' loop (LayoutSpeechSession) against the export's
own (SpeechSession)."""

from __future__ import annotations

import numpy as np

from export.checks.cases import mel_frames
from export.checks.layout import step_rows
from export.checks.parity import DEFAULT_ATOL, DEFAULT_RTOL, GENERATION_STEPS, Report
from runtime.sessions import Runtime
from runtime.speech_sessions import (
    LayoutSpeechSession,
    SpeechSession,
    greedy_tokens,
)


def check_speech_layout(runtime: Runtime, atol: float = DEFAULT_ATOL,
                        rtol: float = DEFAULT_RTOL, steps: int = GENERATION_STEPS,
                        seed: int = 0) -> Report:
    card = runtime.card
    rng = np.random.default_rng(seed)
    full = 2 * card["max_source_positions"]
    report = Report()
    for batch, length, target in ((1, full, 1), (2, min(full, 32), 3)):
        features = {"input_features": mel_frames(rng, card, batch, length)}
        report.rows += step_rows(
            runtime, f"b{batch} frames{length} s{target}", features, {},
            lambda size, batch=batch: rng.integers(0, card["vocab_size"], (batch, size),
                                                   dtype=np.int64),
            target, atol, rtol)
    steps = min(steps, card["max_positions"] - 1)
    features = mel_frames(rng, card, 2, full)
    tokens = [greedy_tokens(session, features, card["bos_token_id"], steps)
              for session in (SpeechSession(runtime), LayoutSpeechSession(runtime))]
    report.generation.append(("seq2seq layout's loop vs decoder.onnx's", bool(
        np.array_equal(*tokens)), steps))
    return report
