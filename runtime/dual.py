"""A dual encoder's export (CLIP, SigLIP; export/families/dual.py) run without torch: texts
through onnx/text_model.onnx and images through onnx/vision_model.onnx to unit-length vectors
in one space (a dot product is the cosine the model compares), and zero-shot scores of images
against label texts through the joint onnx/model.onnx.

A card with a logit_bias (SigLIP) scores each label alone, by a sigmoid; one without (CLIP)
shares the probability among the labels, by a softmax over them, as transformers.js's
zero-shot-image-classification pipeline does for each.
"""

from __future__ import annotations

import numpy as np

from registry.dual import takes_text_mask
from runtime.contract import MODEL_GRAPH, TEXT_GRAPH, VISION_GRAPH
from runtime.engine import Engine
from runtime.prompts import check_ids

PROMPT_TEMPLATE = "a photo of a {}."  # the CLIP paper's prompt for ImageNet's labels


def unit(vectors: np.ndarray) -> np.ndarray:
    norms = np.linalg.norm(vectors.astype(np.float64), axis=-1, keepdims=True)
    return (vectors / np.maximum(norms, 1e-12)).astype(np.float32)


def text_feeds(engine: Engine, prompts: list[list[int]]) -> dict[str, np.ndarray]:
    """Token ids right-padded with the card's pad token (CLIP's is its end token, after the
    text's own), the padding masked. A tower with no mask (SigLIP's) reads texts padded to
    max_positions, as its processor pads them, and attends to the padding."""
    card = engine.card
    check_ids(card, prompts)
    masked = takes_text_mask(card)
    width = max(map(len, prompts)) if masked else card["max_positions"]
    pad = card["pad_token_id"]
    ids = np.array([p + [pad] * (width - len(p)) for p in prompts], np.int64)
    if not masked:
        return {"input_ids": ids}
    mask = np.array([[1] * len(p) + [0] * (width - len(p)) for p in prompts], np.int64)
    return {"input_ids": ids, "attention_mask": mask}


def text_vectors(engine: Engine, prompts: list[list[int]]) -> np.ndarray:
    """(texts, projection_dim) unit-length vectors."""
    return unit(engine.run(TEXT_GRAPH, text_feeds(engine, prompts))["text_embeds"])


def image_vectors(engine: Engine, pixel_values: np.ndarray) -> np.ndarray:
    """(images, projection_dim) unit-length vectors of processed pixel values."""
    return unit(engine.run(VISION_GRAPH, {"pixel_values": pixel_values})["image_embeds"])


def zero_shot(engine: Engine, pixel_values: np.ndarray, labels: list[list[int]]
              ) -> np.ndarray:
    """(images, labels) scores: each image against every label's text."""
    feeds = {**text_feeds(engine, labels), "pixel_values": pixel_values}
    logits = engine.run(MODEL_GRAPH, feeds)["logits_per_image"].astype(np.float64)
    if engine.card["logit_bias"] is not None:  # SigLIP: each label on its own
        return 1.0 / (1.0 + np.exp(-logits))
    shifted = np.exp(logits - logits.max(axis=-1, keepdims=True))
    return shifted / shifted.sum(axis=-1, keepdims=True)


def prompts_for(labels: list[str], template: str | None) -> list[str]:
    """Each label as the text the model compares: put in `template` at `{}`, or alone."""
    return [label if template is None else template.replace("{}", label) for label in labels]
