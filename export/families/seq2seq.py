"""The encoder-decoder (the original Transformer): encoder.onnx runs once per source and also
returns the cross-attention keys/values of it; decoder.onnx runs once per step with its
self-attention cache and those cross keys/values; both share weights.onnx.data."""

from __future__ import annotations

from typing import Any

import numpy as np
import onnx

from export.checks.agreement import STEPS, Agreement, generation_agreement
from export.checks.cases import encoder_cases, seq2seq_decoder_cases
from export.checks.quality import Measure, agreement_measures
from export.families.speech import SpeechFamily
from export.family import Case, Family, GraphIO, Input
from export.onnx.wrappers import SourceEncoderGraph, TargetDecoderGraph
from export.targets.seq2seq_layout import layout_entry, layout_graphs
from registry.catalog import Card
from registry.families import ENCODER_DECODER, SPEECH, spec_of
from runtime.contract import DECODER
from runtime.decoding import Seq2SeqSession
from zoo.blocks.heads import LMHead

SOURCE = ("batch_size", "encoder_sequence_length")
AGREEMENT_PROMPT = 12
SPEECH_FAMILY = SpeechFamily()  # an encoder-decoder card with a mel stem (Whisper)


class Seq2SeqFamily(Family):
    spec = ENCODER_DECODER  # the target is new text: `zoo run --text` prints it alone
    optimizer_model_type = "bert"
    dynamic_files = ("encoder.onnx",)  # once per source; the decoder's steps stay fp32

    def variant(self, card: Any) -> Family:
        return SPEECH_FAMILY if spec_of(card) is SPEECH else self

    def graphs(self, card: Card) -> dict[str, GraphIO]:
        encoder = GraphIO((Input("input_ids", SOURCE, "ids"),
                           Input("attention_mask", SOURCE, "ones")), ("last_hidden_state",),
                          SourceEncoderGraph, attention_groups=("encoder_attentions",),
                          cross_cache="out")
        decoder = GraphIO((Input("input_ids", ("batch_size", "sequence_length"), "target_ids"),
                           Input("encoder_attention_mask", SOURCE, "ones")),
                          (LMHead.graph_output,), TargetDecoderGraph, cache_infix=DECODER,
                          attention_groups=("decoder_attentions", "cross_attentions"),
                          cross_cache="in")
        return {"encoder.onnx": encoder, "decoder.onnx": decoder}

    def layout_graphs(self, card: Card, graphs: dict[str, onnx.ModelProto]
                      ) -> dict[str, onnx.ModelProto]:
        return layout_graphs(card, graphs["encoder.onnx"], graphs["decoder.onnx"])

    def layout_entry(self, card: Card) -> dict[str, Any]:
        return layout_entry(card)

    def parity_cases(self, reference: Any, rng: np.random.Generator) -> list[Case]:
        return (encoder_cases(reference, rng, "encoder.onnx", with_token_types=False)
                + seq2seq_decoder_cases(reference, rng))

    def quality(self, reference: Any, candidate: Any, seed: int) -> list[Measure]:
        return agreement_measures(self.agreement(reference, candidate, STEPS, seed))

    def agreement(self, reference: Any, candidate: Any, steps: int, seed: int) -> Agreement:
        steps = min(steps, reference.card["max_positions"] - 1)
        return generation_agreement(Seq2SeqSession(reference), Seq2SeqSession(candidate),
                                    reference.card, AGREEMENT_PROMPT, steps, seed)
