"""Embedding requests of one export batched together: a thread takes every request waiting,
runs all their rows as `zoo embed` runs a corpus (runtime/corpus.py: sorted by length, batches
sized by a token budget, right padding masked out, so a row gets what it gets alone), and hands
each request its rows back. While one batch runs, the next requests gather."""

from __future__ import annotations

import logging
import threading
from collections import deque
from concurrent.futures import Future

import numpy as np

from runtime.corpus import run_corpus, token_budget
from runtime.engine import Engine

LOG = logging.getLogger("zoo.serve")


class Embedder:
    def __init__(self, engine: Engine, name: str) -> None:
        self.engine = engine
        self.budget = token_budget(getattr(engine, "threads", None))
        self.inbox: deque[tuple[list[list[int]], Future[np.ndarray]]] = deque()
        self.wake = threading.Condition()
        threading.Thread(target=self._loop, name=f"embed-{name}", daemon=True).start()

    def submit(self, prompts: list[list[int]]) -> Future[np.ndarray]:
        """The prompts' vectors (rows, d), once a batch has run them."""
        future: Future[np.ndarray] = Future()
        with self.wake:
            self.inbox.append((prompts, future))
            self.wake.notify()
        return future

    def _loop(self) -> None:
        while True:
            with self.wake:
                while not self.inbox:
                    self.wake.wait()
                jobs = list(self.inbox)
                self.inbox.clear()
            try:
                vectors = run_corpus(self.engine, [row for rows, _ in jobs for row in rows],
                                     self.budget).embeddings
            except Exception as exc:  # a fault of the server: each request gets a 500
                LOG.exception("embedding batch failed")
                for _, future in jobs:
                    future.set_exception(exc)
                continue
            start = 0
            for rows, future in jobs:
                future.set_result(vectors[start:start + len(rows)])
                start += len(rows)
