"""An encoder with a patch stem (a ViT): one graph, onnx/model.onnx, `pixel_values` (batch,
channels, image_size, image_size) in, then the hidden states and what the card's heads declare
(the class token's vector, the classifier's logits) out: the layout transformers.js's
`image-classification` pipeline and Optimum's ORTModelForImageClassification open. The image's
size is fixed by the card (the positions are learned per patch); the batch is dynamic."""

from __future__ import annotations

from typing import Any

import numpy as np

from export.checks.agreement import Agreement, image_agreement
from export.family import Case, Family, GraphIO, Input
from export.onnx.quantize import BITS
from export.onnx.wrappers import ImageGraph
from registry.catalog import Card
from registry.errors import ZooError
from registry.families import IMAGE
from runtime.contract import MODEL_GRAPH
from zoo.blocks.heads import encoder_heads

PIXELS = ("batch_size", "num_channels", "height", "width")  # Optimum's names for them


class ImageEncoderFamily(Family):
    spec = IMAGE
    optimizer_model_type = "vit"
    dynamic_files = ()

    def graphs(self, card: Card) -> dict[str, GraphIO]:
        outputs = ("last_hidden_state", *(spec.head.graph_output for spec in encoder_heads(card)))
        return {MODEL_GRAPH: GraphIO((Input("pixel_values", PIXELS, "pixels"),), outputs,
                                      ImageGraph, attention_groups=("attentions",))}

    def check_quantization(self, card: Card, choice: str | None) -> None:
        """int8 and int4 (weight-only) are checked by the labels' agreement over images; the
        others' checks read text (int8-dynamic's quality gate) or a GGUF file."""
        if choice not in (None, *BITS):
            raise ZooError(f"{card.name}: --quantize {choice} is not supported for an image "
                           f"encoder; use --quantize {' or '.join(BITS)}")

    def agreement(self, reference: Any, candidate: Any, steps: int, seed: int) -> Agreement:
        return image_agreement(reference, candidate, seed)

    def parity_cases(self, reference: Any, rng: np.random.Generator) -> list[Case]:
        """Batch 1 and 3 of normalized pixels (about unit scale, as a processor gives them)."""
        card = reference.card
        side, channels = card["image_size"], card["channels"]
        return [Case(f"b{batch} {side}x{side}", MODEL_GRAPH,
                     {"pixel_values": rng.standard_normal((batch, channels, side, side))
                      .astype(np.float32)}) for batch in (1, 3)]
