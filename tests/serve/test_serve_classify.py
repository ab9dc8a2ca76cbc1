"""/v1/classify is batched as /v1/embeddings is (issue 36): requests arriving while a batch
runs gather and run together through the export's embedder (sorted by length, padding masked
out), and each text still gets the probabilities `zoo.load(OUT).classify` gives it alone."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.conftest import ON_CLASSIFIER

pytest.importorskip("starlette")
pytestmark = ON_CLASSIFIER


class HeldFirstBatch:
    """A runtime whose runs are counted and whose first run waits until three more requests
    are queued: requests pile up behind a running batch, however slow the event loop is."""

    def __init__(self, runtime: Any) -> None:
        self.runtime, self.card, self.spec = runtime, runtime.card, runtime.spec
        self.runs, self.embedder = 0, None

    def run(self, file: str, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        self.runs += 1
        deadline = time.monotonic() + 30
        while self.runs == 1 and self.embedder and len(self.embedder.inbox) < 3:
            assert time.monotonic() < deadline, "the other requests never queued"
            time.sleep(0.005)
        return self.runtime.run(file, feeds)


def test_classify_requests_are_batched_and_each_gets_its_own(classifier_export: Path) -> None:
    import zoo
    from runtime.serve.embedder import Embedder
    from runtime.serve.models import Served

    exported = zoo.load(classifier_export)
    served = Served("classifier", exported, max_queue=8)
    slow = HeldFirstBatch(exported.runtime)
    served.embedder = slow.embedder = Embedder(slow, "classifier")
    requests = [[[5, 6, 7]], [[8, 9], [10, 11, 12, 13]], [[14]], [[15, 16, 17]]]

    async def together() -> list[list[dict[str, float]]]:
        first = asyncio.ensure_future(served.classify_batched(requests[0]))
        while not slow.runs:  # the first batch is running: the others gather meanwhile
            await asyncio.sleep(0.005)
        others = asyncio.gather(*(served.classify_batched(prompts) for prompts in requests[1:]))
        return [await first, *await others]

    replies = asyncio.run(together())
    assert slow.runs == 2  # the first request's batch, then the three others' in one
    assert served.admitted == 0
    for prompts, reply in zip(requests, replies, strict=True):
        expected = exported.classify(prompts)
        assert len(reply) == len(expected)
        for got, want in zip(reply, expected, strict=True):
            assert list(got) == list(want)  # the labels, the likeliest first
            np.testing.assert_allclose(list(got.values()), list(want.values()), atol=1e-6)
