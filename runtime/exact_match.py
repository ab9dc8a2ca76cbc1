"""Exact-match accuracy of an exported encoder-decoder on held-out pairs: every source is
translated in one batch (right-padded, greedy or beam search, up to its eos) and counts only
when the whole output equals the target."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from runtime.engine import Engine
from runtime.generate import generate
from runtime.sampling import Sampling


@dataclass
class ExactMatch:
    total: int
    correct: int
    examples: list[tuple[list[int], list[int], list[int]]]  # source, target, output

    @property
    def accuracy(self) -> float:
        return self.correct / self.total


def exact_match(engine: Engine, pairs: list[tuple[list[int], list[int]]], beams: int = 1,
                shown: int = 3) -> ExactMatch:
    card = engine.card
    eos = card["eos_token_id"]
    width = max(len(source) for source, _ in pairs)
    ids = np.full((len(pairs), width), card["pad_token_id"], np.int64)
    mask = np.zeros_like(ids)
    for row, (source, _) in enumerate(pairs):
        ids[row, : len(source)], mask[row, : len(source)] = source, 1
    longest = max(len(target) for _, target in pairs) + 1  # room for the eos
    tokens = generate(engine, ids, mask, longest, Sampling(beams=beams), eos).tolist()
    outputs = [row[: row.index(eos)] if eos in row else row for row in tokens]
    correct = sum(out == target for out, (_, target) in zip(outputs, pairs, strict=True))
    examples = [(s, t, o) for (s, t), o in zip(pairs[:shown], outputs, strict=False)]
    return ExactMatch(len(pairs), correct, examples)
