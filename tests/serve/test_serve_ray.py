"""`zoo serve --ray` (issue 48) with Ray started by the test on 127.0.0.1: two replicas of a
tiny export answer the `openai` client as plain `zoo serve` does, 64 requests at once spread
over both, and each replica's figures reach Ray's metrics; a replica killed mid-load is
replaced, and every request in flight completes or ends in an error the client sees, none
lost or hung; SIGTERM drains. Slow: Ray alone takes
about 25 s to start on this machine. The arguments and the refusal without Ray are checked in
the default run (test_serve_ray_options.py)."""

from __future__ import annotations

import os
import re
import signal
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import on_shared
from tests.support.ray_serve import RayServer
from tests.support.serve import KEY, Server, with_tokenizer

openai = pytest.importorskip("openai")
pytest.importorskip("ray")
pytestmark = [pytest.mark.slow, on_shared("gpt-tiny")]

REQUESTS, LONG = 64, 100  # LONG: max_tokens of the requests a kill or a stop meets in flight
CHATS = [index for index in range(REQUESTS) if index % 4 < 2]  # ask's chat requests
WAIT_S = 90  # the most any request may take, in flight through a kill or a stop


@pytest.fixture(scope="module")
def chat(tmp_path_factory: pytest.TempPathFactory, shared_export) -> Path:
    return with_tokenizer(shared_export("gpt-tiny")[0], tmp_path_factory.mktemp("ray") / "chat")


@pytest.fixture(scope="module")
def ray_server(chat: Path, tmp_path_factory: pytest.TempPathFactory):
    # one row a step and a long queue: under 64 requests both replicas stay busy for seconds,
    # and a chat stream waiting in a replica's queue has begun (its first chunk, the role, is
    # sent as it is queued), so the client sees which requests a replica holds
    server = RayServer([chat], tmp_path_factory.mktemp("ray-log") / "serve.log",
                       "--replicas", "2", "--max-batch", "1")
    try:
        yield server
    finally:
        if server.process.poll() is None:
            try:
                server.stop()
            finally:
                server.kill()
        elif server.processes():
            server.kill()


def client(base: str) -> Any:
    # no retries: every error must reach the test
    return openai.OpenAI(base_url=base + "/v1", api_key=KEY, max_retries=0, timeout=WAIT_S)


def ask(base: str, index: int, max_tokens: int, streamed: bool = False,
        started: Callable[[str | None], None] | None = None) -> tuple[str, str | None]:
    """Request `index` (a chat or a completion, whole or streamed, by its index; all streamed
    with `streamed`): its text and the replica that answered (None from plain zoo serve)."""
    words = " ".join(f"w{3 + (index * 7 + k) % 240}" for k in range(1 + index % 9))
    settings = {"model": "chat", "max_tokens": max_tokens, "temperature": 0,
                "stream": streamed or index % 2 == 1}
    if index % 4 < 2:
        raw = client(base).chat.completions.with_raw_response.create(
            messages=[{"role": "user", "content": words}], **settings)
        if started is not None:
            started(raw.headers.get("x-zoo-replica"))
        parsed = raw.parse()
        text = "".join(chunk.choices[0].delta.content or "" for chunk in parsed
                       if chunk.choices) if settings["stream"] else \
            parsed.choices[0].message.content
    else:
        raw = client(base).completions.with_raw_response.create(prompt=words, **settings)
        if started is not None:
            started(raw.headers.get("x-zoo-replica"))
        parsed = raw.parse()
        text = "".join(chunk.choices[0].text for chunk in parsed if chunk.choices) \
            if settings["stream"] else parsed.choices[0].text
    return text, raw.headers.get("x-zoo-replica")


def at_once(base: str, indices: Iterable[int], max_tokens: int, streamed: bool = False,
            started: Callable[[str | None], None] | None = None,
            ended: Callable[[Any], None] | None = None) -> list[Any]:
    """Requests `indices` sent together: each one's (text, replica) or the exception raised;
    `started` is told the replica as each one's response begins, `ended` each one's result
    as it ends."""
    def one(index: int) -> Any:
        result: Any = None
        try:
            result = ask(base, index, max_tokens, streamed, started)
        except Exception as exc:  # noqa: BLE001 (what the client saw is the result)
            result = exc
        if ended is not None:
            ended(result)
        return result

    indices = list(indices)
    with ThreadPoolExecutor(len(indices)) as pool:
        futures = [pool.submit(one, index) for index in indices]
        return [future.result(timeout=WAIT_S + 30) for future in futures]


@pytest.fixture(scope="module")
def plain_answers(chat: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[int, str]:
    """Plain `zoo serve`'s greedy answers to the same requests (max_tokens LONG: a shorter
    greedy answer is a prefix)."""
    server = Server([chat], tmp_path_factory.mktemp("plain") / "serve.log", "--api-key", KEY)
    try:
        answers = at_once(server.base, range(REQUESTS), LONG)
    finally:
        assert server.stop() == 0
    assert all(isinstance(answer, tuple) for answer in answers), answers
    return {index: text for index, (text, _) in enumerate(answers)}


def test_two_replicas_answer_as_zoo_serve(ray_server: RayServer,
                                          plain_answers: dict[int, str]) -> None:
    answers = at_once(ray_server.base, range(REQUESTS), LONG)
    failed = [answer for answer in answers if not isinstance(answer, tuple)]
    assert failed == [], failed
    assert {index: text for index, (text, _) in enumerate(answers)} == plain_answers
    assert sum(len(text) for text in plain_answers.values()) > REQUESTS * 10
    served = Counter(replica for _, replica in answers)
    assert len(served) == 2 and min(served.values()) > 0, served
    # each replica's zoo_ figures in Ray's metrics, tagged with the replica: its completion
    # tokens, over both, are the words of the answers (a word a token; eos counted by none)
    words = sum(len(text.split()) for text in plain_answers.values())
    deadline, tokens = time.monotonic() + 90, {}
    while time.monotonic() < deadline:
        tokens = ray_server.ray_metrics("ray_zoo_tokens_total", kind="completion")
        if set(tokens) == set(served) and sum(tokens.values()) >= words:
            break
        time.sleep(2)
    assert set(tokens) == set(served), (tokens, served)
    assert words <= sum(tokens.values()) <= words + REQUESTS, (tokens, words)


def test_a_killed_replica_is_replaced_and_no_request_is_lost(
        ray_server: RayServer, plain_answers: dict[int, str]) -> None:
    """Chat streams only, so each one's replica is known as it is queued there: the first
    replica to hold 6 begun and unfinished (one decoding, the others waiting) is killed
    (SIGKILL) at once, by the client thread that saw it. Each request then completes whole or
    raises an error the client sees, within the bound; a new replica answers afterwards."""
    before = {ray_server.replica() for _ in range(20)}
    deadline, pids = time.monotonic() + 30, {}
    while time.monotonic() < deadline and set(pids) != before:  # Ray's log comes in batches
        time.sleep(1)
        pids = ray_server.replica_pids()
    assert set(pids) == before, (pids, before)
    held: Counter[str | None] = Counter()
    lock, victim = threading.Lock(), {}

    def started(replica: str | None) -> None:
        with lock:
            held[replica] += 1
            if held[replica] >= 6 and not victim and replica in pids:
                os.kill(pids[replica], signal.SIGKILL)
                victim[replica] = held[replica]

    def ended(result: Any) -> None:
        if isinstance(result, tuple):
            with lock:
                held[result[1]] -= 1

    start = time.monotonic()
    answers = dict(zip(CHATS, at_once(ray_server.base, CHATS, LONG, streamed=True,
                                      started=started, ended=ended), strict=True))
    assert victim, f"no replica held 6 streams at once: {held}"
    on_victim = next(iter(victim.values()))
    assert time.monotonic() - start < WAIT_S + 30  # none hung
    done = [index for index, answer in answers.items() if isinstance(answer, tuple)]
    errors = [answer for answer in answers.values() if not isinstance(answer, tuple)]
    for index in done:  # a completed answer is whole
        assert answers[index][0] == plain_answers[index], index
    # the killed replica's streams in flight (on_victim begun): cut (the openai client's
    # APIConnectionError), a 500 for one whose answer had not begun, or sent again by Ray's
    # router to the other replica (then whole, as checked above: never a stream begun twice)
    assert all(isinstance(error, openai.APIConnectionError | openai.InternalServerError)
               for error in errors), (errors, on_victim)
    assert len(done) + len(errors) == len(CHATS)
    deadline, now = time.monotonic() + 120, set()
    while time.monotonic() < deadline and not now - before:  # Ray starts a new one
        try:
            now |= {ray_server.replica() for _ in range(10)}
        except OSError:
            time.sleep(1)
    assert now - before, f"no new replica in 120 s: {ray_server.tail()}"
    assert all(isinstance(answer, tuple) for answer in at_once(ray_server.base, range(8), 4))


def test_sigterm_drains_the_requests_in_flight(ray_server: RayServer,
                                               plain_answers: dict[int, str]) -> None:
    """Chat streams only: each one begins as its replica queues it, so the stop comes once all
    32 are at a replica (16 each, answered one at a time)."""
    begun, ends = threading.Semaphore(0), []
    before = set(ray_server.processes())
    with ThreadPoolExecutor(1) as stopper:
        def stop_when_all_started() -> int:
            for _ in CHATS:
                assert begun.acquire(timeout=WAIT_S)
            return ray_server.stop()

        status = stopper.submit(stop_when_all_started)
        answers = at_once(ray_server.base, CHATS, LONG, streamed=True,
                          started=lambda replica: begun.release(),
                          ended=lambda result: ends.append(time.time()))
        assert status.result(timeout=150) == 0
    for index, answer in zip(CHATS, answers, strict=True):  # each whole, though stopped
        assert isinstance(answer, tuple) and answer[0] == plain_answers[index], (index, answer)
    # some were still being answered when Ray began to delete the application (its log's
    # time, this machine's clock): they were drained, not finished before the stop
    deleting = re.search(r"INFO (\S+ \S+) serve \d+ -- Deleting app", ray_server.tail(20000))
    assert deleting is not None, ray_server.tail()
    began = datetime.strptime(deleting[1], "%Y-%m-%d %H:%M:%S,%f").timestamp()
    assert max(ends) > began, (max(ends), began)
    assert before and ray_server.processes() == []  # the Ray it started stopped with it
