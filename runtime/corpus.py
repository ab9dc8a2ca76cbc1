"""A corpus through a model with a sentence vector: rows sorted by length so that a batch pads
little, batches sized by a token budget (the machine's cores decide it), every result put back
in its row's place. Each batch is runtime/classify.py's run_sequences, so a row gets what it
gets alone (right padding is masked out of attention and pooling)."""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from runtime.classify import run_sequences
from runtime.engine import Engine

TOKENS_PER_CORE = 1024  # padded tokens a batch holds per core: larger batches bought little
BUDGET_LIMITS = (2048, 16384)
MAX_ROWS = 256


@dataclass
class CorpusOutputs:
    embeddings: np.ndarray  # (rows, d), in row order
    probabilities: np.ndarray | None  # (rows, num_labels); None: no classifier


def token_budget(threads: int | None = None) -> int:
    """Padded tokens per batch for this machine (or `threads` cores)."""
    if threads is None:
        threads = (len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity")
                   else os.cpu_count() or 1)
    cores = threads
    low, high = BUDGET_LIMITS
    return min(high, max(low, TOKENS_PER_CORE * cores))


def length_batches(lengths: list[int], budget: int) -> list[list[int]]:
    """Row indices in batches of similar length: shortest first, a batch closed when one more
    row would take its padded size (rows x longest) past `budget` or its rows past MAX_ROWS."""
    batches: list[list[int]] = []
    batch: list[int] = []
    for index in sorted(range(len(lengths)), key=lengths.__getitem__):  # stable: ties in order
        if batch and ((len(batch) + 1) * lengths[index] > budget or len(batch) == MAX_ROWS):
            batches.append(batch)
            batch = []
        batch.append(index)
    return batches + ([batch] if batch else [])


def run_corpus(engine: Engine, prompts: list[list[int]], budget: int,
               progress: Callable[[int], None] = lambda done: None) -> CorpusOutputs:
    """Every prompt's sentence vector (and class probabilities), in prompt order;
    `progress(rows done)` after each batch."""
    embeddings: np.ndarray | None = None
    probabilities: np.ndarray | None = None
    done = 0
    for batch in length_batches([len(prompt) for prompt in prompts], budget):
        result = run_sequences(engine, [prompts[index] for index in batch])
        if embeddings is None:
            embeddings = np.empty((len(prompts), result.embeddings.shape[1]), np.float32)
            if result.probabilities is not None:
                probabilities = np.empty((len(prompts), result.probabilities.shape[1]))
        embeddings[batch] = result.embeddings
        if probabilities is not None:
            probabilities[batch] = result.probabilities
        done += len(batch)
        progress(done)
    assert embeddings is not None, "run_corpus needs at least one prompt"
    return CorpusOutputs(embeddings, probabilities)
