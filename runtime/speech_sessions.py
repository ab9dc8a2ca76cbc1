"""Whisper's two ways through an export, behind one interface (`encode` the clips' log-mel
frames once, then `step` the decoder): the export's own graphs (encoder.onnx returns the
cross-attention keys/values, decoder.onnx takes them every step) and the clients' layout
(encoder_model.onnx gives the memory alone; decoder_model_merged.onnx's first step projects it
to the cross cache and returns it, later steps take it back), which Optimum and transformers.js
run. Neither graph reads a mask: every frame is real (silence is padded in)."""

from __future__ import annotations

import numpy as np

from runtime.decoding import EncoderDecoderSession

SPEECH_ENCODER, SPEECH_DECODER = "encoder.onnx", "decoder.onnx"


class SpeechSession(EncoderDecoderSession):
    """Log-mel frames for a source: nothing of it for the decoder but its encoding."""

    def encode(self, features: np.ndarray) -> None:
        """Log-mel frames (B, n_mels, frames): the cross cache, once; an empty self cache."""
        self._encode({"input_features": features.astype(np.float32)})

    def step(self, ids: np.ndarray) -> np.ndarray:
        """Target ids (B, T) after the cached steps: the last position's logits (B, vocab)."""
        return self._decode(ids)

    def keep(self, rows: np.ndarray) -> None:
        """Only these rows go on (the others finished)."""
        self.past = [p[rows] for p in self.past]
        self.cross = {name: value[rows] for name, value in self.cross.items()}


class LayoutSpeechSession(SpeechSession):
    """The clients' loop over the layout's two graphs."""

    layout = True

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
