"""Picking tokens: greedy, sampling (temperature, top-k, top-p) and beam search, over any
session with `prefill`, `step`, `expand` and `reorder` (runtime/decoding.py,
runtime/shared_cache.py)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from registry.errors import ZooError

SEEDS = 2**64


@dataclass
class Sampling:
    """How to pick the next token: greedy (default), sampling, or beam search."""

    temperature: float = 0.0  # 0: greedy
    top_k: int = 0  # 0: no limit
    top_p: float = 1.0
    seed: int = 0
    beams: int = 1

    def generator(self) -> np.random.Generator:
        """The draws' generator. Any integer is a seed (OpenAI's `seed` and `zoo run --seed`
        alike): numpy wants a non-negative one, so it is taken modulo 2**64 (-1 draws as
        2**64 - 1 does)."""
        return np.random.default_rng(self.seed % SEEDS)

    def check(self) -> None:
        if self.temperature < 0:
            raise ZooError(f"--temperature {self.temperature}: should be >= 0")
        if not 0 < self.top_p <= 1:
            raise ZooError(f"--top-p {self.top_p}: should be in (0, 1]")
        if self.top_k < 0 or self.beams < 1:
            raise ZooError("--top-k should be >= 0 and --beams >= 1")
        if self.beams > 1 and self.temperature > 0:
            raise ZooError("--beams and --temperature cannot be combined")


def check_new_tokens(new_tokens: int) -> None:
    if new_tokens < 1:
        raise ZooError(f"--max-new-tokens {new_tokens}: should be >= 1")


def _pick(logits: np.ndarray, sampling: Sampling, uniforms: np.ndarray) -> np.ndarray:
    """One token per row; `uniforms` holds each row's draw in [0, 1) (unused when greedy)."""
    if sampling.temperature == 0:
        return logits.argmax(axis=-1)
    # Shifted by each row's maximum before dividing: every scaled logit is then <= 0 and the
    # largest is 0, so any positive temperature, even 1e-308, gives finite probabilities (a
    # tiny one underflows the others to exactly 0: greedy, ties shared), where dividing first
    # overflowed to inf - inf = NaN.
    shifted = logits.astype(np.float64) - logits.max(axis=-1, keepdims=True)
    with np.errstate(over="ignore"):
        scaled = shifted / sampling.temperature
    if sampling.top_k:
        kth = np.sort(scaled, axis=-1)[:, -min(sampling.top_k, scaled.shape[-1])][:, None]
        scaled = np.where(scaled < kth, -np.inf, scaled)
    probs = np.exp(scaled)
    probs /= probs.sum(axis=-1, keepdims=True)
    if sampling.top_p < 1:
        order = np.argsort(-probs, axis=-1)
        sorted_probs = np.take_along_axis(probs, order, axis=-1)
        # Keep the smallest prefix whose mass reaches top_p (always at least one token).
        outside = np.cumsum(sorted_probs, axis=-1) - sorted_probs >= sampling.top_p
        np.put_along_axis(probs, order, np.where(outside, 0.0, sorted_probs), axis=-1)
        probs /= probs.sum(axis=-1, keepdims=True)
    # Inverse CDF, exactly as Generator.choice(p=row) turns its one random() into a token.
    cdf = np.cumsum(probs, axis=-1)
    cdf /= cdf[:, -1:]
    return np.array([row.searchsorted(u, side="right") for row, u in zip(cdf, uniforms,
                                                                          strict=True)])


def pick_one(logits: np.ndarray, sampling: Sampling, rng: np.random.Generator) -> int:
    """One prompt's next token from its (vocab,) logits, drawn as `decode` draws for a batch
    of one (one uniform a step when sampling): a row of `zoo serve`'s batch, which has its own
    settings and generator, picks what `zoo run` picks for its prompt alone."""
    uniforms = rng.random(1) if sampling.temperature > 0 else np.zeros(1)
    return int(_pick(logits[None], sampling, uniforms)[0])


def _compaction(keep: np.ndarray) -> np.ndarray:
    """The rows to keep, in an order that moves fewest: each dropped row's slot below the new
    batch size is refilled from a kept row above it (the shared cache copies only those)."""
    kept = np.flatnonzero(keep)
    rows = np.arange(len(kept))
    holes = np.flatnonzero(~keep[: len(kept)])
    rows[holes] = kept[kept >= len(kept)]
    return rows


def decode(session: Any, ids: np.ndarray, mask: np.ndarray, new_tokens: int,
           sampling: Sampling, eos: int | None, constraints: list[Any] | None = None
           ) -> np.ndarray:
    """New tokens (B, new_tokens) from an open session; rows that reach `eos` are padded with
    it afterwards and leave the batch (`session.reorder` to the live rows), so later steps
    cost only the rows still generating.

    Sampling draws one uniform per prompt per step for every prompt, finished or not (as the
    loop did when it still fed finished rows): a row's draws, hence its tokens, never depend
    on when the other rows finish."""
    if sampling.beams > 1:
        return _beam_search(session, ids, mask, new_tokens, sampling.beams, eos)
    rng = sampling.generator()
    logits = session.prefill(ids, mask)
    batch = len(ids)
    result = np.full((batch, new_tokens), 0 if eos is None else eos, np.int64)
    live = np.arange(batch)  # live[i]: the prompt that session row i generates
    for index in range(new_tokens):
        uniforms = rng.random(batch) if sampling.temperature > 0 else np.zeros(batch)
        if constraints is not None:
            logits = np.stack([constraints[row].mask(row_logits)
                               for row, row_logits in zip(live, logits, strict=True)])
        token = _pick(logits, sampling, uniforms[live])
        for row, picked in zip(live, token, strict=True) if constraints is not None else ():
            constraints[row].advance(picked)
        result[live, index] = token
        if index + 1 == new_tokens:
            break
        if eos is not None and (token == eos).any():
            keep = token != eos
            if not keep.any():
                break
            rows = _compaction(keep)
            session.reorder(rows)
            live, token = live[rows], token[rows]
        logits = session.step(token)
    return result


def log_softmax(logits: np.ndarray) -> np.ndarray:
    """In float64, shifted by the row's maximum (beam scores and perplexity sum many)."""
    shifted = logits.astype(np.float64) - logits.max(axis=-1, keepdims=True)
    return shifted - np.log(np.exp(shifted).sum(axis=-1, keepdims=True))


def _beam_search(session: Any, ids: np.ndarray, mask: np.ndarray,
                 new_tokens: int, beams: int, eos: int | None) -> np.ndarray:
    """Highest total log-probability sequence per row; finished beams keep emitting `eos`."""
    batch = len(ids)
    logits = session.prefill(ids, mask)
    session.expand(beams)  # once; later reorders stay within each row's beams
    logits = np.repeat(logits, beams, axis=0)
    scores = np.full((batch, beams), -np.inf)
    scores[:, 0] = 0.0  # all beams start identical: expand only the first
    sequences = np.zeros((batch * beams, 0), np.int64)
    finished = np.zeros(batch * beams, bool)
    for index in range(new_tokens):
        log_probs = log_softmax(logits)
        if eos is not None:  # a finished beam can only continue with eos, at no cost
            log_probs[finished] = -np.inf
            log_probs[finished, eos] = 0.0
        vocab = log_probs.shape[-1]
        total = (scores.reshape(-1, 1) + log_probs).reshape(batch, beams * vocab)
        best = np.argsort(-total, axis=-1, kind="stable")[:, :beams]
        scores = np.take_along_axis(total, best, axis=-1)
        rows = (np.arange(batch)[:, None] * beams + best // vocab).reshape(-1)
        token = (best % vocab).reshape(-1)
        sequences = np.concatenate([sequences[rows], token[:, None]], axis=1)
        finished = finished[rows] | (token == eos if eos is not None else False)
        if index + 1 < new_tokens:
            session.reorder(rows)
            logits = session.step(token)
    winner = scores.argmax(axis=-1)
    return sequences.reshape(batch, beams, -1)[np.arange(batch), winner]
