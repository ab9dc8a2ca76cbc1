"""Perplexity of a decoder on a text, through any engine (ONNX Runtime or PyTorch).

The text is cut into consecutive windows of the model's context (max_positions tokens), each
run on its own with an empty cache: a window's first token has no context and is not scored,
so a window of L tokens scores its L - 1 next-token predictions. Every window is run whole, so
the figure is the same whether the engine batches or not. The argmax at every scored position
is kept, so two exports of one model can be compared on the same real text (top-1 agreement).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from registry.errors import ZooError
from runtime.contract import CACHE_INPUT, MODEL_GRAPH, past_names
from runtime.decoding import empty_past
from runtime.engine import Engine
from runtime.sampling import log_softmax

BATCH = 8  # windows per run: full windows share one length, so they stack


@dataclass
class TextScore:
    predictions: int  # next-token predictions scored
    nll: float  # their summed negative log-likelihood, nats
    top1: np.ndarray  # the engine's best token at each scored position, in text order

    @property
    def nats_per_token(self) -> float:
        return self.nll / self.predictions

    @property
    def perplexity(self) -> float:
        return float(np.exp(self.nats_per_token))


def text_windows(ids: Sequence[int], length: int) -> list[np.ndarray]:
    """Consecutive windows of `length` tokens; a last window shorter than 2 scores nothing."""
    if length < 2:
        raise ZooError(f"window {length}: should be >= 2 tokens")
    chunks = [np.asarray(ids[start:start + length], np.int64)
              for start in range(0, len(ids), length)]
    chunks = [chunk for chunk in chunks if len(chunk) >= 2]
    if not chunks:
        raise ZooError(f"{len(ids)} tokens: too short to score (need at least 2)")
    return chunks


def _run(engine: Engine, ids: np.ndarray) -> np.ndarray:
    """Logits for every position of a (batch, length) block, from an empty cache."""
    batch, length = ids.shape
    names = past_names(engine.card["n_layers"], CACHE_INPUT)
    feeds = {"input_ids": ids, "attention_mask": np.ones_like(ids),
             "position_ids": np.broadcast_to(np.arange(length, dtype=np.int64), ids.shape).copy(),
             **dict(zip(names, empty_past(engine, batch), strict=True))}
    return engine.run(MODEL_GRAPH, feeds)["logits"]


def score_text(engine: Engine, ids: Sequence[int], window: int | None = None,
               progress: Callable[[int, int], None] = lambda done, total: None) -> TextScore:
    """Summed next-token NLL and argmaxes of a decoder over `ids` (see the module doc)."""
    length = window or engine.card["max_positions"]
    if length > engine.card["max_positions"]:
        raise ZooError(f"window {length}: longer than max_positions "
                       f"{engine.card['max_positions']}")
    chunks = text_windows(ids, length)
    nll, predictions, top1 = 0.0, 0, []
    groups = [chunks[i:i + BATCH] for i in range(0, len(chunks), BATCH)]
    groups = [g for group in groups for g in _same_length(group)]
    done = 0
    for group in groups:
        block = np.stack(group)
        logprobs = log_softmax(_run(engine, block)[:, :-1])
        targets = block[:, 1:]
        nll -= float(np.take_along_axis(logprobs, targets[..., None], axis=-1).sum())
        predictions += targets.size
        top1.extend(logprobs.argmax(axis=-1).reshape(-1))
        done += len(group)
        progress(done, len(chunks))
    return TextScore(predictions, nll, np.asarray(top1, np.int64))


def _same_length(group: list[np.ndarray]) -> list[list[np.ndarray]]:
    """Only the text's last window can be shorter: run it alone."""
    full = [chunk for chunk in group if len(chunk) == len(group[0])]
    rest = [[chunk] for chunk in group if len(chunk) != len(group[0])]
    return [full, *rest]


def top1_agreement(reference: TextScore, candidate: TextScore) -> float:
    """The share of positions where both pick the same next token (same text, same windows)."""
    if reference.top1.shape != candidate.top1.shape:
        raise ZooError("top-1 agreement: the two scores cover different positions")
    return float((reference.top1 == candidate.top1).mean())
