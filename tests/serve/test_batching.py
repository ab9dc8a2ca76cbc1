"""Continuous batching (issue 36): `zoo serve`'s scheduler decodes every active row a step,
newcomers join between steps and finished rows leave; each request's tokens must be exactly
those of its prompt alone through `zoo run`'s generate (greedy, and sampled with a seed), in
the plain loop (cache left-padded when rows join) and the --optimize shared-cache loop (rows
copied into free slots, buffers grown), on gpt-tiny and on llama-tiny (grouped-query
attention, rotary positions)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from runtime.opening import open_export
from runtime.sampling import Sampling
from runtime.serve.scheduler import Job, Scheduler
from tests.conftest import SharedExport, on_shared
from tests.support.serve import Collected, alone

pytestmark = on_shared("gpt-tiny")

# (prompt length, max_tokens): short answers finish while long ones run, so rows leave and
# queued ones join mid-flight; a 40-token prompt joins a batch narrower than it, 1-token ones
# join a wider one
REQUESTS = [(3, 20), (11, 5), (6, 12), (1, 30), (9, 8), (4, 3), (40, 16), (2, 25), (1, 6),
            (17, 9)]
SAMPLED = Sampling(temperature=1.0, top_p=0.9, seed=7)


def run_batched(runtime: Any, prompts: list[list[int]], jobs: list[tuple[int, Sampling]],
                max_batch: int) -> tuple[list[list[int]], Scheduler]:
    scheduler = Scheduler(runtime, max_batch, lambda ids: "", "test")
    sinks = [Collected() for _ in prompts]
    with scheduler.wake:  # its thread takes none of them until all are queued (a re-entrant lock)
        for prompt, (tokens, sampling), sink in zip(prompts, jobs, sinks, strict=True):
            scheduler.submit(Job(prompt, tokens, sampling, (), False, sink))
    for sink in sinks:
        assert sink.finished.wait(120), "a request never finished"
    results = []
    for sink in sinks:
        (name, completion), = [event for event in sink.events if event[0] != "piece"]
        assert name == "done", sink.events
        results.append(completion.ids)
    return results, scheduler


@pytest.mark.parametrize(("name", "variant"), [("gpt-tiny", "plain"), ("gpt-tiny", "optimize"),
                                               ("llama-tiny", "optimize")])  # GQA, rotary
def test_each_row_gets_its_tokens_alone_whoever_shares_the_batch(
        shared_export: SharedExport, name: str, variant: str) -> None:
    runtime = open_export(shared_export(name, variant)[0])
    rng = np.random.default_rng(11)
    prompts = [rng.integers(3, 250, n).tolist() for n, _ in REQUESTS]
    jobs = [(tokens, SAMPLED if index == 2 else Sampling())
            for index, (_, tokens) in enumerate(REQUESTS)]
    expected = [alone(runtime, prompt, tokens, sampling)
                for prompt, (tokens, sampling) in zip(prompts, jobs, strict=True)]
    got, scheduler = run_batched(runtime, prompts, jobs, max_batch=4)
    for index, (row, want) in enumerate(zip(got, expected, strict=True)):
        assert row == want, f"request {index}: batched {row} != alone {want}"
    _, batch, steps, decoded, largest = scheduler.gauges()
    assert batch == 0 and largest == 4  # batches really formed, bounded by max_batch
    # each step decodes one token for every row: far fewer steps than tokens
    assert decoded == sum(len(row) for row in got) - len(got)  # the first comes from prefill
    assert steps < decoded / 2


def test_a_cancelled_row_leaves_at_the_next_step(shared_export: SharedExport) -> None:
    runtime = open_export(shared_export("gpt-tiny", "optimize")[0])
    scheduler = Scheduler(runtime, 4, lambda ids: "x" * len(ids), "test")  # a piece a token
    gone, stays = Collected(), Collected()

    def leaves_at_its_third_token(event: tuple) -> None:  # on the scheduler's thread: no race
        gone(event)
        long_job.cancelled = len(long_job.tokens) >= 3

    long_job = Job([5, 6, 7], 100, Sampling(), (), True, leaves_at_its_third_token)
    scheduler.submit(long_job)
    scheduler.submit(Job([9, 8], 30, Sampling(), (), False, stays))
    assert gone.finished.wait(60) and gone.events[-1] == ("gone", None)
    assert len(long_job.tokens) == 3  # not one token decoded for it after
    assert stays.finished.wait(60) and stays.events[-1][0] == "done"
    assert stays.events[-1][1].ids == alone(runtime, [9, 8], 30, Sampling())


def test_a_stream_gets_each_piece_as_its_token_is_decoded(shared_export: SharedExport) -> None:
    """A word a token: one piece per token, each sent when the answer had only the tokens up
    to it (not after the whole generation); a stop string cuts the text and ends the answer,
    and its first word, which might have begun the stop, waits until it does not."""
    runtime = open_export(shared_export("gpt-tiny")[0])
    words = lambda ids: " ".join(f"w{t}" for t in ids if t < 256)  # noqa: E731
    scheduler = Scheduler(runtime, 4, words, "test")
    sink = Collected()
    job = Job([5, 6, 7], 12, Sampling(), (), True, sink)
    seen: list[int] = []
    sink_call = sink.__call__
    sink_events = lambda event: (seen.append(len(job.tokens)), sink_call(event))  # noqa: E731
    job.emit = sink_events
    scheduler.submit(job)
    assert sink.finished.wait(60)
    pieces = [value for name, value in sink.events if name == "piece"]
    completion = sink.events[-1][1]
    expected = alone(runtime, [5, 6, 7], 12, Sampling())
    assert completion.ids == expected and "".join(pieces) == words(expected)
    assert seen[:len(pieces)] == list(range(1, len(pieces) + 1))  # piece k after token k
    full, stop = words(expected), words(expected[3:5])  # the 4th and 5th words
    stopped = Collected()
    scheduler.submit(Job([5, 6, 7], 12, Sampling(), (stop,), True, stopped))
    assert stopped.finished.wait(60)
    cut = stopped.events[-1][1]
    assert cut.text == full[:full.index(stop)] and cut.finish_reason == "stop"
    assert "".join(v for n, v in stopped.events if n == "piece") == cut.text
    # it stopped at the first token whose text holds the stop, not at max_tokens
    assert len(cut.ids) == min(k for k in range(13) if stop in words(expected[:k])) < 12


class Counting:
    """The plain graph of a runtime, recording each run's input_ids shape."""

    def __init__(self, runtime: Any) -> None:
        self.runtime, self.card, self.spec, self.shapes = runtime, runtime.card, runtime.spec, []

    def run(self, file: str, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        self.shapes.append(feeds["input_ids"].shape)
        return self.runtime.run(file, feeds)


def test_a_step_prefills_at_most_its_budget(shared_export: SharedExport) -> None:
    """Twelve 100-token prompts at once: a step prefills 5 (5 x 100 padded tokens <= 512), so
    the rows decoding wait for at most that much; the rest join at the next steps."""
    from runtime.serve.scheduler import PREFILL_TOKENS

    engine = Counting(open_export(shared_export("gpt-tiny")[0]))
    rng = np.random.default_rng(2)
    prompts = [rng.integers(3, 250, 100).tolist() for _ in range(12)]
    got, _ = run_batched(engine, prompts, [(6, Sampling())] * 12, max_batch=16)
    prefills = [rows for rows, width in engine.shapes if width > 1]
    assert max(prefills) == PREFILL_TOKENS // 100 == 5 and sum(prefills) == 12
    assert got == [alone(engine.runtime, prompt, 6, Sampling()) for prompt in prompts]


def test_a_finished_row_has_left_the_batch_when_its_client_is_told(
        shared_export: SharedExport) -> None:
    """/metrics' batch size counts no client that already has its answer (or was told it is
    gone): the last event is sent once the row is out. Read on the scheduler's own thread."""
    runtime = open_export(shared_export("gpt-tiny", "optimize")[0])
    scheduler = Scheduler(runtime, 4, lambda ids: "x" * len(ids), "test")
    seen: dict[str, int] = {}
    sinks = {kind: Collected() for kind in ("short", "gone", "long")}

    def telling(kind: str) -> Any:
        def on_event(event: tuple) -> None:
            if event[0] in ("done", "gone"):
                seen[kind] = scheduler.gauges()[1]  # rows decoding as the client hears
            elif kind == "gone" and len(jobs["gone"].tokens) >= 2:
                jobs["gone"].cancelled = True
            sinks[kind](event)
        return on_event

    jobs = {"short": Job([5, 6, 7], 3, Sampling(), (), True, telling("short")),
            "gone": Job([8, 9], 100, Sampling(), (), True, telling("gone")),
            "long": Job([10, 11], 40, Sampling(), (), True, telling("long"))}
    with scheduler.wake:  # all three join in one prefill
        for job in jobs.values():
            scheduler.submit(job)
    for sink in sinks.values():
        assert sink.finished.wait(60)
    # step 2 drops the hung-up row (cancelled at its 2nd token) before decoding: told with the
    # two others in; the short one's 3rd token ends it in that step: told with "long" alone
    assert seen == {"gone": 2, "short": 1, "long": 0}
