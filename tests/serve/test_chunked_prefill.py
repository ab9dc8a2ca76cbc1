"""Chunked prefill in `zoo serve` (issue 36): a prompt longer than the prefill chunk is fed a
chunk a step through its cache, between the decoding steps of the rows already running, and
its greedy tokens are still those of its prompt alone through `zoo run`'s generate (one pass),
in the plain loop (gpt-tiny) and the --optimize shared-cache loop (llama-tiny: grouped-query
attention, rotary positions, GroupQueryAttention's subsequent prompt). A client gone while
its prompt is chunked stops the chunks."""

from __future__ import annotations

import threading
import time
from typing import Any

import numpy as np
import pytest

from runtime.opening import open_export
from runtime.sampling import Sampling
from runtime.serve.scheduler import Job, Scheduler
from tests.conftest import SharedExport, on_shared
from tests.support.serve import Collected, alone

pytestmark = on_shared("gpt-tiny")

CHUNK, LONG = 16, 50  # a 50-token prompt: chunks of 16, 16, 16 and 2


@pytest.mark.parametrize(("name", "variant"), [("gpt-tiny", "plain"), ("llama-tiny", "optimize")])
def test_a_long_prompt_is_prefilled_in_chunks_between_the_others_steps(
        shared_export: SharedExport, name: str, variant: str) -> None:
    runtime = open_export(shared_export(name, variant)[0])
    scheduler = Scheduler(runtime, 4, lambda ids: "x" * len(ids), "test", prefill_chunk=CHUNK)
    rng = np.random.default_rng(5)
    short, long = rng.integers(3, 250, 4).tolist(), rng.integers(3, 250, LONG).tolist()
    running, sink = Collected(), Collected()
    submitted = threading.Event()

    def on_running(event: tuple) -> None:  # the scheduler's thread waits at the first token
        running(event)
        submitted.wait(60)

    first = Job(short, 60, Sampling(), (), True, on_running)  # a piece a token
    scheduler.submit(first)
    deadline = time.monotonic() + 60
    while not running.events:  # the running row's first token: the scheduler now waits
        assert time.monotonic() < deadline, "the running row never got its first token"
        threading.Event().wait(0.002)
    joined: list[int] = []  # the running row's tokens when the long prompt's first one came

    def on_event(event: tuple) -> None:
        if not joined:
            joined.append(len(first.tokens))
        sink(event)

    scheduler.submit(Job(long, 8, Sampling(), (), True, on_event))
    tokens_at_submit = len(first.tokens)  # the scheduler is still waiting: no race
    submitted.set()
    assert sink.finished.wait(120) and running.finished.wait(120)
    assert sink.events[-1][0] == "done" and running.events[-1][0] == "done"
    assert sink.events[-1][1].ids == alone(runtime, long, 8, Sampling())
    assert running.events[-1][1].ids == alone(runtime, short, 60, Sampling())
    # four chunks, one a step: the running row got a token at each step between them
    assert joined[0] - tokens_at_submit >= -(-LONG // CHUNK) - 1


@pytest.mark.parametrize(("name", "variant"), [("gpt-tiny", "plain"), ("llama-tiny", "optimize")])
def test_a_prompt_fed_in_chunks_gives_the_logits_of_one_pass(
        shared_export: SharedExport, name: str, variant: str) -> None:
    """The sessions' `extend` against their own one-pass prefill: same next-token logits."""
    from runtime.generate import open_session

    runtime = open_export(shared_export(name, variant)[0])
    prompt = np.random.default_rng(3).integers(3, 250, (1, 37))
    whole = open_session(runtime, 40).prefill(prompt, None)
    chunked = open_session(runtime, 40)
    chunked.prefill(prompt[:, :16], None)
    chunked.extend(prompt[:, 16:32])
    np.testing.assert_allclose(chunked.extend(prompt[:, 32:]), whole, atol=1e-4)


class LeavesMidPrompt:
    """The plain graph of a runtime whose client leaves once 8 of its prompt's tokens are in
    the cache: cancelled from the scheduler's own thread, so the point is known, not raced."""

    def __init__(self, runtime: Any, job: Job) -> None:
        self.runtime, self.card, self.spec = runtime, runtime.card, runtime.spec
        self.job, self.scheduler, self.left = job, None, threading.Event()

    def run(self, file: str, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        filling = self.scheduler and self.scheduler.filling
        if filling is not None and filling.fed >= 8 and not self.left.is_set():
            self.job.cancelled = True
            self.left.set()
        return self.runtime.run(file, feeds)


def test_a_client_gone_while_its_prompt_is_chunked_stops_its_prefill(
        shared_export: SharedExport) -> None:
    runtime = open_export(shared_export("gpt-tiny")[0])
    sink = Collected()
    job = Job(list(range(3, 103)), 5, Sampling(), (), False, sink)  # 25 chunks
    leaving = LeavesMidPrompt(runtime, job)
    scheduler = Scheduler(leaving, 4, lambda ids: "", "test", prefill_chunk=4)
    leaving.scheduler = scheduler
    scheduler.submit(job)
    assert leaving.left.wait(60)
    assert sink.finished.wait(60) and sink.events == [("gone", None)]
    assert not job.tokens and scheduler.filling is None
    after = Collected()  # the scheduler goes on serving
    scheduler.submit(Job([5, 6, 7], 4, Sampling(), (), False, after))
    assert after.finished.wait(60) and after.events[-1][1].ids == alone(runtime, [5, 6, 7], 4,
                                                                        Sampling())
