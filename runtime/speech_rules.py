"""The rules Whisper's greedy decoding applies to each step's logits, as transformers'
WhisperForConditionalGeneration.generate applies them (in its order: SuppressTokensAtBegin,
SuppressTokens, then WhisperTimeStampLogits where timestamps are asked for). Numpy, on one row
of logits, so the PyTorch reference and the ONNX transcription share them.

Timestamps (Radford et al. 2022, section 2.3): the first token after the prompt is a timestamp,
no later than `max_initial_timestamp_index`; timestamps come in pairs (a segment's end, the next
one's start) except right before the end; they never go back; and where the timestamps together
are likelier than any one text token, a timestamp is chosen.
"""

from __future__ import annotations

import numpy as np

from runtime.sampling import log_softmax
from runtime.speech_tokens import SpeechTokens

BLOCKED = -np.inf


def _timestamp_rules(scores: np.ndarray, generated: list[int], tokens: SpeechTokens) -> None:
    begin = tokens.timestamp_begin
    scores[tokens.no_timestamps] = BLOCKED
    last_was_timestamp = len(generated) >= 1 and generated[-1] >= begin
    penultimate_was_timestamp = len(generated) < 2 or generated[-2] >= begin
    if last_was_timestamp:
        if penultimate_was_timestamp:  # a pair is closed: text next
            scores[begin:] = BLOCKED
        else:  # a segment's end: its pair, or the end of the text
            scores[: tokens.end] = BLOCKED
    stamps = [token for token in generated if token >= begin]
    lowest = begin  # not before the last timestamp (nor the same one, but to close a pair)
    if stamps:
        lowest = stamps[-1] if last_was_timestamp and not penultimate_was_timestamp \
            else stamps[-1] + 1
    scores[begin:lowest] = BLOCKED
    if not generated:  # the first token is a timestamp, not too late
        scores[:begin] = BLOCKED
        if tokens.max_initial_timestamp_index is not None:
            scores[begin + tokens.max_initial_timestamp_index + 1:] = BLOCKED
    logprobs = log_softmax(scores)
    with np.errstate(divide="ignore"):
        timestamp_logprob = np.logaddexp.reduce(logprobs[begin:])
    if timestamp_logprob > logprobs[:begin].max():
        scores[:begin] = BLOCKED


def constrained(logits: np.ndarray, generated: list[int], tokens: SpeechTokens,
                timestamps: bool) -> np.ndarray:
    """A copy of one step's logits (vocab,) with what may not come next at -inf; `generated`:
    the tokens after the forced prompt."""
    scores = np.array(logits, dtype=np.float32)
    if not generated:
        scores[list(tokens.begin_suppress)] = BLOCKED
    scores[list(tokens.suppress)] = BLOCKED
    if timestamps:
        _timestamp_rules(scores, generated, tokens)
    return scores


def next_token(logits: np.ndarray, generated: list[int], tokens: SpeechTokens,
               timestamps: bool) -> int:
    """The greedy choice under the rules."""
    return int(np.argmax(constrained(logits, generated, tokens, timestamps)))
