"""Embedding and classifying requests of one export batched together: a thread takes every
request waiting, runs all their rows as `zoo embed` runs a corpus (runtime/corpus.py: sorted by
length, batches sized by a token budget, right padding masked out, so a row gets what it gets
alone), and hands each request its rows back (vectors, and a classifier's probabilities). While
one batch runs, the next requests gather."""

from __future__ import annotations

import logging
import threading
from collections import deque
from concurrent.futures import Future

from runtime.corpus import CorpusOutputs, run_corpus, token_budget
from runtime.engine import Engine
from runtime.serve.errors import log_fault

LOG = logging.getLogger("zoo.serve")


class Embedder:
    def __init__(self, engine: Engine, name: str) -> None:
        self.engine = engine
        self.budget = token_budget(getattr(engine, "threads", None))
        self.inbox: deque[tuple[list[list[int]], Future[CorpusOutputs]]] = deque()
        self.wake = threading.Condition()
        threading.Thread(target=self._loop, name=f"embed-{name}", daemon=True).start()

    def submit(self, prompts: list[list[int]]) -> Future[CorpusOutputs]:
        """The prompts' vectors (rows, d) and probabilities, once a batch has run them."""
        future: Future[CorpusOutputs] = Future()
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
                result = run_corpus(self.engine, [row for rows, _ in jobs for row in rows],
                                    self.budget)
            except Exception as exc:  # a fault of the server: each request gets a 500
                log_fault(LOG, "embedding batch", exc)
                for _, future in jobs:
                    future.set_exception(exc)
                continue
            start = 0
            vectors, probabilities = result.embeddings, result.probabilities
            for rows, future in jobs:
                end = start + len(rows)
                future.set_result(CorpusOutputs(vectors[start:end], None if probabilities is None
                                                else probabilities[start:end]))
                start = end
