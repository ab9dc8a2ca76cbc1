"""The encoder-decoder with a mel stem (Whisper): encoder.onnx reads `input_features` (batch,
n_mels, frames; the frames dynamic, 2 * max_source_positions for 30 s) and returns the memory
and every decoder layer's cross-attention keys/values of it, once per clip; decoder.onnx runs
once per step with its self-attention cache and those cross keys/values, no mask. The clients'
layout (onnx/encoder_model.onnx, onnx/decoder_model_merged.onnx) is the seq2seq family's, with
the masks left out as Optimum's and transformers.js's Whisper graphs have them."""

from __future__ import annotations

from typing import Any

import numpy as np
import onnx

from export.checks.agreement import Agreement, generation_agreement
from export.checks.cases import mel_frames
from export.family import Case, Family, GraphIO, Input
from export.onnx.precision import FP32
from export.onnx.wrappers import SpeechDecoderGraph, SpeechEncoderGraph
from export.targets.seq2seq_layout import layout_entry, layout_graphs
from registry.catalog import Card
from registry.errors import ZooError
from registry.families import SPEECH
from runtime.contract import CACHE_INPUT, CACHE_OUTPUT, DECODER, ENCODER, past_names
from runtime.decoding import empty_past
from runtime.speech_sessions import (
    SPEECH_DECODER,
    SPEECH_ENCODER,
    SpeechSession,
    greedy_tokens,
)

FRAMES = ("batch_size", "feature_size", "encoder_frames")
TARGET = ("batch_size", "sequence_length")
WEIGHT_ONLY = ("int8", "int4")  # MatMulNBits: the decoder's steps read fewer weight bytes


class _FramesPrompt:
    """A SpeechSession behind the prefill/step interface generation_agreement drives: its
    prompt is the clip's frames (the random ids it is handed are not read) and the start
    token."""

    def __init__(self, session: SpeechSession, features: np.ndarray) -> None:
        self.session, self.features = session, features

    def prefill(self, ids: np.ndarray, mask: np.ndarray | None) -> np.ndarray:
        self.session.encode(self.features)
        start = self.session.engine.card["bos_token_id"]
        return self.session.step(np.full((len(self.features), 1), start, np.int64))

    def step(self, tokens: np.ndarray) -> np.ndarray:
        return self.session.step(tokens[:, None])


class SpeechFamily(Family):
    spec = SPEECH
    optimizer_model_type = "bert"

    def graphs(self, card: Card) -> dict[str, GraphIO]:
        encoder = GraphIO((Input("input_features", FRAMES, "normal"),), ("last_hidden_state",),
                          SpeechEncoderGraph, attention_groups=("encoder_attentions",),
                          cross_cache="out")
        decoder = GraphIO((Input("input_ids", TARGET, "target_ids"),), ("logits",),
                          SpeechDecoderGraph, cache_infix=DECODER,
                          attention_groups=("decoder_attentions", "cross_attentions"),
                          cross_cache="in")
        return {SPEECH_ENCODER: encoder, SPEECH_DECODER: decoder}

    def layout_graphs(self, card: Card, graphs: dict[str, onnx.ModelProto]
                      ) -> dict[str, onnx.ModelProto]:
        return layout_graphs(card, graphs[SPEECH_ENCODER], graphs[SPEECH_DECODER])

    def layout_entry(self, card: Card) -> dict[str, Any]:
        return layout_entry(card)

    def check_quantization(self, card: Card, choice: str | None) -> None:
        if choice is not None and choice not in WEIGHT_ONLY:  # int8-dynamic, gguf
            raise ZooError(f"{card.name}: --quantize {choice} is not supported for a speech "
                           f"model; use --quantize {' or '.join(WEIGHT_ONLY)} (weight-only "
                           "MatMulNBits, checked by greedy agreement over audio frames)")

    def check_dtype(self, card: Card, dtype: str) -> None:
        if dtype != FP32:  # the float16 check's greedy run starts from token ids
            raise ZooError(f"{card.name}: --dtype {dtype} is not supported for a speech model "
                           "(its float16 check generates from token prompts, not audio); "
                           "export it in float32")

    def agreement(self, reference: Any, candidate: Any, steps: int, seed: int) -> Agreement:
        """Top-1 agreement along the reference's greedy continuation (teacher-forced) from the
        start token, over one random window of frames."""
        card = reference.card
        steps = min(steps, card["max_positions"] - 1)
        features = mel_frames(np.random.default_rng(seed), card, 1,
                          2 * card["max_source_positions"])
        return generation_agreement(_FramesPrompt(SpeechSession(reference), features),
                                    _FramesPrompt(SpeechSession(candidate), features), card,
                                    1, steps, seed)

    def parity_cases(self, reference: Any, rng: np.random.Generator) -> list[Case]:
        """The encoder on 30 s (the card's whole window) and on a shorter clip; the decoder
        over each one's cross cache, with and without a self cache."""
        card = reference.card
        full = 2 * card["max_source_positions"]
        short = min(full, 32)
        cases = [Case(f"b{batch} frames{length}", SPEECH_ENCODER,
                      {"input_features": mel_frames(rng, card, batch, length)})
                 for batch, length in ((1, full), (3, short))]
        return cases + self._decoder_cases(reference, rng, full, short)

    def _decoder_cases(self, reference: Any, rng: np.random.Generator, full: int, short: int
                       ) -> list[Case]:
        card = reference.card
        n = card["n_layers"]
        self_in, self_out = (past_names(n, CACHE_INPUT, DECODER),
                             past_names(n, CACHE_OUTPUT, DECODER))
        cross = dict(zip(past_names(n, CACHE_INPUT, ENCODER), past_names(n, CACHE_OUTPUT, ENCODER),
                         strict=True))
        limit = min(card["max_positions"], 16)
        cases = []
        for batch, length, past_length, clip in ((1, 4, 0, full), (3, limit // 2, 0, short),
                                                 (3, 1, limit // 3, short),
                                                 (1, limit - limit // 3, limit // 3, full)):
            encoded = reference.run(SPEECH_ENCODER,
                                    {"input_features": mel_frames(rng, card, batch, clip)})
            shared = {name: encoded[output] for name, output in cross.items()}
            cache = empty_past(reference, batch)
            if past_length:
                prefix = reference.run(SPEECH_DECODER, {
                    "input_ids": self._ids(rng, card, batch, past_length), **shared,
                    **dict(zip(self_in, cache, strict=True))})
                cache = [prefix[name] for name in self_out]
            cases.append(Case(f"b{batch} s{length} past{past_length} frames{clip}",
                              SPEECH_DECODER, {"input_ids": self._ids(rng, card, batch, length),
                                               **shared, **dict(zip(self_in, cache,
                                                                    strict=True))}))
        return cases

    def generation_check(self, reference: Any, candidate: Any, steps: int, seed: int
                         ) -> tuple[str, bool, int] | None:
        """Greedy tokens from the start token over two clips, the export's loop in both."""
        card = reference.card
        steps = min(steps, card["max_positions"] - 1)
        features = mel_frames(np.random.default_rng(seed), card, 2,
                              2 * card["max_source_positions"])
        same = np.array_equal(*(greedy_tokens(SpeechSession(engine), features,
                                              card["bos_token_id"], steps)
                                for engine in (reference, candidate)))
        return "batch 2, the whole window of frames", same, steps

    @staticmethod
    def _ids(rng: np.random.Generator, card: Card, batch: int, length: int) -> np.ndarray:
        return rng.integers(0, card["vocab_size"], (batch, length), dtype=np.int64)
