"""Running an exported encoder: the pooled vector and masked-token predictions."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from registry.catalog import Card
from runtime.contract import MODEL_GRAPH
from runtime.engine import Engine
from runtime.prompts import check_ids


@dataclass
class MaskedPrediction:
    position: int
    tokens: list[int]
    probabilities: list[float]


def encoder_feeds(card: Card, ids: np.ndarray, mask: np.ndarray | None = None,
                  token_type_ids: np.ndarray | None = None) -> dict[str, np.ndarray]:
    """Feeds for an encoder graph: token types (all 0 unless given) only where the card has
    them, since only then does the graph take them."""
    ids = np.asarray(ids, np.int64)
    feeds = {"input_ids": ids, "attention_mask": np.ones_like(ids) if mask is None else mask}
    if card["type_vocab_size"]:
        feeds["token_type_ids"] = (np.zeros_like(ids) if token_type_ids is None
                                   else token_type_ids)
    return feeds


def encode(engine: Engine, ids: np.ndarray, top: int = 5
           ) -> tuple[np.ndarray | None, list[MaskedPrediction]]:
    """Pooled vector (d,) for one sequence of ids, and the top MLM predictions at each position
    holding the card's mask token."""
    card = engine.card
    ids = np.asarray(ids, np.int64)[None]
    check_ids(card, ids)
    feeds = encoder_feeds(card, ids)
    outputs = engine.run(MODEL_GRAPH, feeds)
    pooled = outputs["pooler_output"][0] if "pooler_output" in outputs else None
    predictions = []
    if "logits" in outputs and card["mask_token_id"] is not None:
        for position in np.flatnonzero(ids[0] == card["mask_token_id"]):
            logits = outputs["logits"][0, position].astype(np.float64)
            probabilities = np.exp(logits - logits.max())
            probabilities /= probabilities.sum()
            best = np.argsort(-probabilities)[:top]
            predictions.append(MaskedPrediction(int(position), best.tolist(),
                                                probabilities[best].tolist()))
    return pooled, predictions
