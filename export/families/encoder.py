"""The BERT-style encoder: one graph (model.onnx) whose outputs are the hidden states and then
whatever the card's heads declare (zoo/blocks/heads.py)."""

from __future__ import annotations

from typing import Any

import numpy as np

from export.checks.agreement import Agreement, masked_lm_agreement
from export.checks.cases import encoder_cases
from export.checks.quality import Measure, encoder_quality
from export.families.image import ImageEncoderFamily
from export.family import Case, Family, GraphIO, Input
from export.onnx.wrappers import EncoderGraph
from registry.catalog import Card
from registry.families import ENCODER, IMAGE, spec_of
from runtime.contract import MODEL_GRAPH
from runtime.files.tokenizer import load_tokenizer
from zoo.blocks.heads import encoder_heads

TOKENS = ("batch_size", "sequence_length")
IMAGE_ENCODER = ImageEncoderFamily()  # an encoder card with a patch stem (a ViT)


class EncoderFamily(Family):
    spec = ENCODER
    optimizer_model_type = "bert"
    dynamic_files = (MODEL_GRAPH,)

    def variant(self, card: Any) -> Family:
        return IMAGE_ENCODER if spec_of(card) is IMAGE else self

    def graphs(self, card: Card) -> dict[str, GraphIO]:
        inputs = [Input("input_ids", TOKENS, "ids"), Input("attention_mask", TOKENS, "ones"),
                  Input("token_type_ids", TOKENS, "zeros", when="type_vocab_size")]
        outputs = ("last_hidden_state",
                   *(spec.head.graph_output for spec in encoder_heads(card)))
        kept = tuple(i for i in inputs if i.when is None or card[i.when])
        return {MODEL_GRAPH: GraphIO(kept, outputs, EncoderGraph,
                                      attention_groups=("attentions",))}

    def parity_cases(self, reference: Any, rng: np.random.Generator) -> list[Case]:
        return encoder_cases(reference, rng, MODEL_GRAPH, with_token_types=True)

    def agreement(self, reference: Any, candidate: Any, steps: int, seed: int) -> Agreement:
        return masked_lm_agreement(reference, candidate, seed)

    def quality(self, reference: Any, candidate: Any, seed: int) -> list[Measure]:
        folder = getattr(candidate, "folder", None)  # a Runtime: the export's own tokenizer
        tokenizer = load_tokenizer(folder) if folder is not None else None
        return encoder_quality(reference, candidate, MODEL_GRAPH, seed, tokenizer)
