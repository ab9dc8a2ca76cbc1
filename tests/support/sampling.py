"""A fixed table of logits over a tiny vocabulary, and the exhaustive scores the sampling tests
compare beam search with."""

from __future__ import annotations

import numpy as np

VOCAB = 6
EOS = 5


def table_logits(prefix: tuple[int, ...]) -> np.ndarray:
    """Logits that depend on the whole prefix, the same each time it is asked for."""
    seed = hash(prefix) % (2**32)
    return np.random.default_rng(seed).normal(0, 2, VOCAB)


class PrefixSession:
    """A session whose logits are a function of each row's prompt and tokens so far; it
    follows `reorder` the way a cache does."""

    def __init__(self) -> None:
        self.prefixes: list[tuple[int, ...]] = []

    def prefill(self, ids: np.ndarray, mask: np.ndarray | None) -> np.ndarray:
        self.prefixes = [tuple(row) for row in ids.tolist()]
        return np.stack([table_logits(p) for p in self.prefixes])

    def expand(self, beams: int) -> None:
        self.prefixes = [prefix for prefix in self.prefixes for _ in range(beams)]

    def reorder(self, rows: np.ndarray) -> None:
        self.prefixes = [self.prefixes[row] for row in rows]

    def step(self, token: np.ndarray) -> np.ndarray:
        self.prefixes = [p + (t,) for p, t in zip(self.prefixes, token.tolist(), strict=True)]
        return np.stack([table_logits(p) for p in self.prefixes])


def log_softmax(logits: np.ndarray) -> np.ndarray:
    shifted = logits - logits.max()
    return shifted - np.log(np.exp(shifted).sum())


def sequence_score(prompt: tuple[int, ...], tokens: tuple[int, ...], eos: int | None) -> float:
    """Total log-probability; after eos the sequence is over (its padding costs nothing)."""
    score, prefix = 0.0, prompt
    for token in tokens:
        score += log_softmax(table_logits(prefix))[token]
        if token == eos:
            break
        prefix += (token,)
    return score
