"""A decoder with a pooling in its card: a sequence model (a classifier or an embedder, as
GPT2ForSequenceClassification), not a generator. One graph (model.onnx) with the encoder's
inputs and outputs (no token types, no cache), so it runs, checks and benchmarks like one."""

from __future__ import annotations

from typing import Any

import numpy as np

from export.checks.cases import encoder_cases
from export.families.encoder import TOKENS, EncoderFamily
from export.family import Case, GraphIO, Input
from export.onnx.wrappers import SequenceGraph
from registry.catalog import Card
from registry.families import SEQUENCE
from runtime.contract import MODEL_GRAPH
from zoo.blocks.heads import sequence_heads


class SequenceDecoderFamily(EncoderFamily):
    spec = SEQUENCE
    optimizer_model_type = "gpt2"

    def graphs(self, card: Card) -> dict[str, GraphIO]:
        inputs = (Input("input_ids", TOKENS, "ids"), Input("attention_mask", TOKENS, "ones"))
        outputs = ("last_hidden_state",
                   *(spec.head.graph_output for spec in sequence_heads(card)))
        return {MODEL_GRAPH: GraphIO(inputs, outputs, SequenceGraph,
                                      attention_groups=("attentions",))}

    def parity_cases(self, reference: Any, rng: np.random.Generator) -> list[Case]:
        return encoder_cases(reference, rng, MODEL_GRAPH, with_token_types=False)
