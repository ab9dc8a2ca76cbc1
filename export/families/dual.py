"""A dual encoder (CLIP, SigLIP; registry/dual.py) in the layout transformers.js and Optimum
read: `onnx/text_model.onnx` (CLIPTextModelWithProjection: input_ids, attention_mask ->
text_embeds, last_hidden_state), `onnx/vision_model.onnx` (CLIPVisionModelWithProjection:
pixel_values -> image_embeds, last_hidden_state) and `onnx/model.onnx` (CLIPModel, the
zero-shot graph: logits_per_image, logits_per_text and the unit-length text_embeds and
image_embeds). The joint graph's texts and images are batched apart (text_batch_size,
image_batch_size, as Optimum names them); the image's size is the vision card's."""

from __future__ import annotations

from typing import Any

import numpy as np

from export.checks.agreement import IMAGES as CHECK_IMAGES
from export.checks.agreement import Agreement, check_images
from export.checks.cases import random_ids
from export.family import Case, Family, GraphIO, Input
from export.onnx.quantize import BITS
from export.onnx.wrappers import Wrapper
from registry.catalog import Card
from registry.dual import takes_text_mask
from registry.errors import ZooError
from registry.families import DUAL_ENCODER
from runtime.contract import MODEL_GRAPH, TEXT_GRAPH, VISION_GRAPH

TEXTS = ("text_batch_size", "sequence_length")
AGREEMENT_TEXTS = 16  # the texts each check image is matched against
IMAGES = ("image_batch_size", "num_channels", "height", "width")


class TextGraph(Wrapper):
    def forward(self, input_ids, attention_mask):  # noqa: ANN001
        return self.outputs(lambda: tuple(
            self.model.encode_text(input_ids, attention_mask).values()))


class UnmaskedTextGraph(Wrapper):
    """SigLIP's: every position attended (registry/dual.py takes_text_mask)."""

    def forward(self, input_ids):  # noqa: ANN001
        return self.outputs(lambda: tuple(self.model.encode_text(input_ids).values()))


class VisionGraph(Wrapper):
    def forward(self, pixel_values):  # noqa: ANN001
        return self.outputs(lambda: tuple(self.model.encode_image(pixel_values).values()))


class JointGraph(Wrapper):
    def forward(self, input_ids, attention_mask, pixel_values):  # noqa: ANN001
        return self.outputs(lambda: tuple(
            self.model(input_ids, attention_mask, pixel_values).values()))


class UnmaskedJointGraph(Wrapper):
    def forward(self, input_ids, pixel_values):  # noqa: ANN001
        return self.outputs(lambda: tuple(self.model(input_ids, None, pixel_values).values()))


class DualEncoderFamily(Family):
    spec = DUAL_ENCODER
    optimizer_model_type = "clip"
    standalone_graphs = True

    def graphs(self, card: Card) -> dict[str, GraphIO]:
        masked = takes_text_mask(card)
        texts = (Input("input_ids", TEXTS, "ids"),
                 *([Input("attention_mask", TEXTS, "ones")] if masked else []))
        pixels = Input("pixel_values", IMAGES, "pixels")
        return {
            TEXT_GRAPH: GraphIO(texts, ("text_embeds", "last_hidden_state"),
                                TextGraph if masked else UnmaskedTextGraph),
            VISION_GRAPH: GraphIO((pixels,), ("image_embeds", "last_hidden_state"),
                                  VisionGraph),
            MODEL_GRAPH: GraphIO((*texts, pixels), ("logits_per_image", "logits_per_text",
                                                    "text_embeds", "image_embeds"),
                                 JointGraph if masked else UnmaskedJointGraph),
        }

    def check_quantization(self, card: Card, choice: str | None) -> None:
        """int8 and int4 (weight-only) are checked by zero-shot agreement over images and
        texts; the others' checks read text alone (int8-dynamic's gate) or a GGUF file."""
        if choice not in (None, *BITS):
            raise ZooError(f"{card.name}: --quantize {choice} is not supported for a dual "
                           f"encoder; use --quantize {' or '.join(BITS)}")

    def agreement(self, reference: Any, candidate: Any, steps: int, seed: int) -> Agreement:
        """Each of the check's images matched to the likeliest of its texts (the joint graph's
        logits_per_image), as zero-shot labels are: the fp32 text among the candidate's top 5."""
        from runtime.files.images import model_processor

        card, vision = reference.card, reference.card["vision"]
        rng = np.random.default_rng(seed)
        processor = model_processor(getattr(candidate, "folder", None), vision)
        ids, mask = padded_texts(reference, rng, batch=AGREEMENT_TEXTS)
        feeds = {**text_feeds(card, ids, mask),
                 "pixel_values": check_images(vision, processor, CHECK_IMAGES, seed)}
        e = reference.run(MODEL_GRAPH, feeds)["logits_per_image"]
        a = candidate.run(MODEL_GRAPH, feeds)["logits_per_image"]
        agreeing = int((e.argmax(-1) == a.argmax(-1)).sum())
        top5 = int(sum(row in np.argsort(-a[i])[:5] for i, row in enumerate(e.argmax(-1))))
        side = vision["image_size"]
        return Agreement(f"zero-shot top-1, {CHECK_IMAGES} images {side}x{side} x "
                         f"{AGREEMENT_TEXTS} texts", len(e), agreeing, top5,
                         float(np.abs(a - e).max()))

    def parity_cases(self, reference: Any, rng: np.random.Generator) -> list[Case]:
        """Texts of one token, of the longest length, and three right-padded with the end
        token (as CLIP's tokenizer pads); one and three images; the joint graph over two texts
        and three images."""
        card = reference.card
        vision, longest = card["vision"], card["max_positions"]
        texts = [(random_ids(reference, rng, 1, 1), None),
                 (random_ids(reference, rng, 1, longest), None), padded_texts(reference, rng)]
        cases = [Case(f"text b{ids.shape[0]} s{ids.shape[1]}" + (" padded" if mask is not None
                                                               else ""),
                      TEXT_GRAPH, text_feeds(card, ids, mask)) for ids, mask in texts]
        side, channels = vision["image_size"], vision["channels"]

        def images(batch: int) -> np.ndarray:
            return rng.standard_normal((batch, channels, side, side)).astype(np.float32)

        cases += [Case(f"image b{batch}", VISION_GRAPH, {"pixel_values": images(batch)})
                  for batch in (1, 3)]
        ids, mask = padded_texts(reference, rng, batch=2)
        cases.append(Case("joint 2 texts 3 images", MODEL_GRAPH, {
            **text_feeds(card, ids, mask), "pixel_values": images(3)}))
        return cases


def text_feeds(card: Card, ids: np.ndarray, mask: np.ndarray | None
               ) -> dict[str, np.ndarray]:
    """The text inputs the card's graphs take (no mask for SigLIP's)."""
    if not takes_text_mask(card):
        return {"input_ids": ids}
    return {"input_ids": ids, "attention_mask": np.ones_like(ids) if mask is None else mask}


def padded_texts(reference: Any, rng: np.random.Generator, batch: int = 3
                 ) -> tuple[np.ndarray, np.ndarray]:
    """Rows of several lengths, each closed by the end token and padded with it after."""
    card = reference.card
    length = max(2, card["max_positions"] // 2)
    ids = random_ids(reference, rng, batch, length)
    mask = np.ones_like(ids)
    end = card["eos_token_id"] if card["eos_token_id"] is not None else card["pad_token_id"]
    for row in range(batch):
        real = length - row * length // (batch + 1)
        ids[row, real - 1:] = end
        mask[row, real:] = 0
    return ids, mask
