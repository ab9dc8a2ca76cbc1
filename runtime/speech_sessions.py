"""Whisper's two ways through an export, behind one interface (`encode` the clips' log-mel
frames once, then `step` the decoder): the export's own graphs (encoder.onnx returns the
cross-attention keys/values, decoder.onnx takes them every step) and the clients' layout
(encoder_model.onnx gives the memory alone; decoder_model_merged.onnx's first step projects it
to the cross cache and returns it, later steps take it back), which Optimum and transformers.js
run. Neither graph reads a mask: every frame is real (silence is padded in)."""

from __future__ import annotations

import numpy as np

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
from runtime.engine import Engine

SPEECH_ENCODER, SPEECH_DECODER = "encoder.onnx", "decoder.onnx"


class SpeechSession:
    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        n_layers = engine.card["n_layers"]
        self.past_inputs = past_names(n_layers, CACHE_INPUT, DECODER)
        self.past_outputs = past_names(n_layers, CACHE_OUTPUT, DECODER)
        self.cross_inputs = past_names(n_layers, CACHE_INPUT, ENCODER)
        self.cross_outputs = past_names(n_layers, CACHE_OUTPUT, ENCODER)

    def encode(self, features: np.ndarray) -> None:
        """Log-mel frames (B, n_mels, frames): the cross cache, once; an empty self cache."""
        encoded = self.engine.run(SPEECH_ENCODER, {"input_features": features.astype(np.float32)})
        self.cross = {name: encoded[output]
                      for name, output in zip(self.cross_inputs, self.cross_outputs, strict=True)}
        self.past = empty_past(self.engine, len(features))

    def step(self, ids: np.ndarray) -> np.ndarray:
        """Target ids (B, T) after the cached steps: the last position's logits (B, vocab)."""
        outputs = self.engine.run(SPEECH_DECODER, {
            "input_ids": ids.astype(np.int64), **self.cross,
            **dict(zip(self.past_inputs, self.past, strict=True))})
        self.past = [outputs[name] for name in self.past_outputs]
        return outputs["logits"][:, -1]

    def keep(self, rows: np.ndarray) -> None:
        """Only these rows go on (the others finished)."""
        self.past = [p[rows] for p in self.past]
        self.cross = {name: value[rows] for name, value in self.cross.items()}


class LayoutSpeechSession(SpeechSession):
    """The clients' loop over the layout's two graphs."""

    def encode(self, features: np.ndarray) -> None:
        self.memory = self.engine.run(LAYOUT_ENCODER, {
            "input_features": features.astype(np.float32)})["last_hidden_state"]
        self.past = empty_past(self.engine, len(features))
        self.cross = {}  # until the first step returns it

    def step(self, ids: np.ndarray) -> np.ndarray:
        first = not self.cross
        cross = dict(zip(self.cross_inputs, empty_past(self.engine, len(ids)), strict=True)
                     ) if first else self.cross
        outputs = self.engine.run(LAYOUT_DECODER, {
            "input_ids": ids.astype(np.int64), "encoder_hidden_states": self.memory,
            USE_CACHE_BRANCH: np.array([not first]), **cross,
            **dict(zip(self.past_inputs, self.past, strict=True))})
        self.past = [outputs[name] for name in self.past_outputs]
        if first:
            self.cross = {name: outputs[output]
                          for name, output in zip(self.cross_inputs, self.cross_outputs,
                                                  strict=True)}
        return outputs["logits"][:, -1]

    def keep(self, rows: np.ndarray) -> None:
        self.memory = self.memory[rows]
        super().keep(rows)


def greedy_tokens(session: SpeechSession, features: np.ndarray, start: int, steps: int
                  ) -> np.ndarray:
    """Plain greedy ids (B, 1 + steps) from the start token, no rules: what the checks compare
    between two ways through an export."""
    session.encode(features)
    tokens = np.full((len(features), 1), start, np.int64)
    for _ in range(steps):
        chosen = session.step(tokens[:, -1:]).argmax(-1)
        tokens = np.concatenate([tokens, chosen[:, None]], axis=1)
    return tokens
