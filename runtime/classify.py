"""Running a model with a sentence vector (a card with `pooling`): each text's embedding and,
for a classifier, its label probabilities; cosine similarities between the texts."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from registry.errors import ZooError
from runtime.contract import MODEL_GRAPH
from runtime.dual import image_vectors, text_vectors
from runtime.encode import encoder_feeds
from runtime.engine import Engine
from runtime.prompts import check_ids


@dataclass
class SequenceOutputs:
    embeddings: np.ndarray  # (B, D) sentence_embedding
    probabilities: np.ndarray | None  # (B, num_labels) softmax of logits; None: no classifier
    labels: list[str]  # the class names, in id order

    def norms(self) -> np.ndarray:
        return np.linalg.norm(self.embeddings.astype(np.float64), axis=1)

    def cosine(self) -> np.ndarray:
        """(B, B): a.b / (|a| |b|); a zero vector's row is 0."""
        vectors = self.embeddings.astype(np.float64)
        unit = vectors / np.maximum(self.norms(), 1e-12)[:, None]
        return unit @ unit.T

    def top(self, row: int, count: int = 5) -> list[tuple[str, float]]:
        assert self.probabilities is not None
        order = np.argsort(-self.probabilities[row], kind="stable")[:count]
        return [(self.labels[i], float(self.probabilities[row, i])) for i in order]

    def to_json(self) -> dict[str, Any]:
        data: dict[str, Any] = {"embeddings": self.embeddings.tolist(),
                                "norms": self.norms().tolist(), "cosine": self.cosine().tolist()}
        if self.probabilities is not None:
            data["labels"] = self.labels
            data["probabilities"] = self.probabilities.tolist()
        return data


def label_names(card: Any) -> list[str]:
    """The card's names, else Hugging Face's defaults LABEL_0, LABEL_1, ..."""
    return list(card["labels"] or [f"LABEL_{i}" for i in range(card["num_labels"])])


def softmax(logits: np.ndarray) -> np.ndarray:
    shifted = np.exp(logits.astype(np.float64) - logits.max(axis=-1, keepdims=True))
    return shifted / shifted.sum(axis=-1, keepdims=True)


def cosines(expected: np.ndarray, actual: np.ndarray) -> np.ndarray:
    """Row-wise cosine over the last axis, in float64."""
    e, a = expected.astype(np.float64), actual.astype(np.float64)
    norms = np.linalg.norm(e, axis=-1) * np.linalg.norm(a, axis=-1)
    return (e * a).sum(-1) / np.maximum(norms, 1e-30)


def right_padded(prompts: list[list[int]], pad: int) -> tuple[np.ndarray, np.ndarray]:
    """(ids, mask) for a batch, each row padded on the right with `pad` (mask 0)."""
    width = max(len(prompt) for prompt in prompts)
    ids = np.array([p + [pad] * (width - len(p)) for p in prompts], np.int64)
    mask = np.array([[1] * len(p) + [0] * (width - len(p)) for p in prompts], np.int64)
    return ids, mask


def run_sequences(engine: Engine, prompts: list[list[int]]) -> SequenceOutputs:
    """One batch through model.onnx: the vectors and, for a classifier, the probabilities (a
    dual encoder's: its text tower's unit vectors)."""
    card = engine.card
    if engine.spec.joint_space:
        return SequenceOutputs(text_vectors(engine, prompts), None, [])
    check_ids(card, prompts)
    ids, mask = right_padded(prompts, card["pad_token_id"])
    outputs = engine.run(MODEL_GRAPH, encoder_feeds(card, ids, mask))
    probabilities = softmax(outputs["logits"]) if card["num_labels"] else None
    return SequenceOutputs(outputs["sentence_embedding"], probabilities, label_names(card))


def run_images(engine: Engine, pixel_values: np.ndarray) -> SequenceOutputs:
    """One batch of (B, channels, H, W) pixel values through model.onnx (an image model; a
    dual encoder's: its vision tower's unit vectors)."""
    card = engine.card
    if engine.spec.joint_space:
        return SequenceOutputs(image_vectors(engine, pixel_values), None, [])
    outputs = engine.run(MODEL_GRAPH, {"pixel_values": pixel_values})
    probabilities = softmax(outputs["logits"]) if card["num_labels"] else None
    return SequenceOutputs(outputs["sentence_embedding"], probabilities, label_names(card))


def predictions(engine: Engine, prompts: list[list[int]], batch: int = 64) -> list[int]:
    """Each prompt's most likely class (first maximum on ties), in right-padded batches."""
    found: list[int] = []
    for start in range(0, len(prompts), batch):
        result = run_sequences(engine, prompts[start:start + batch])
        if result.probabilities is None:
            raise ZooError(f"{engine.card.name}: not a classifier (num_labels is 0)")
        found += result.probabilities.argmax(axis=1).tolist()
    return found
