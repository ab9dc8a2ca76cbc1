"""`zoo serve --ray` (issue 48) with Ray started by the test on 127.0.0.1: two replicas of a
tiny export answer the `openai` client as plain `zoo serve` does, 64 requests at once spread
over both; a replica killed mid-load is replaced, and every request in flight completes or
ends in an error the client sees, none lost or hung; SIGTERM drains. Slow: Ray alone takes
about 25 s to start on this machine. The arguments and the refusal without Ray are checked in
the default run (test_serve_ray_options.py)."""

from __future__ import annotations

import os
import signal
import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
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
WAIT_S = 90  # the most any request may take, in flight through a kill or a stop


@pytest.fixture(scope="module")
def chat(tmp_path_factory: pytest.TempPathFactory, shared_export) -> Path:
    return with_tokenizer(shared_export("gpt-tiny")[0], tmp_path_factory.mktemp("ray") / "chat")


@pytest.fixture(scope="module")
def ray_server(chat: Path, tmp_path_factory: pytest.TempPathFactory):
    # a small batch and a long queue: both replicas stay busy for seconds under 64 requests
    server = RayServer([chat], tmp_path_factory.mktemp("ray-log") / "serve.log",
                       "--replicas", "2", "--max-batch", "4")
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
        started: threading.Semaphore | None = None) -> tuple[str, str | None]:
    """Request `index` (a chat or a completion, whole or streamed, by its index; all streamed
    with `streamed`): its text and the replica that answered (None from plain zoo serve)."""
    words = " ".join(f"w{3 + (index * 7 + k) % 240}" for k in range(1 + index % 9))
    settings = {"model": "chat", "max_tokens": max_tokens, "temperature": 0,
                "stream": streamed or index % 2 == 1}
    if index % 4 < 2:
        raw = client(base).chat.completions.with_raw_response.create(
            messages=[{"role": "user", "content": words}], **settings)
        if started is not None:
            started.release()
        parsed = raw.parse()
        text = "".join(chunk.choices[0].delta.content or "" for chunk in parsed
                       if chunk.choices) if settings["stream"] else \
            parsed.choices[0].message.content
    else:
        raw = client(base).completions.with_raw_response.create(prompt=words, **settings)
        if started is not None:
            started.release()
        parsed = raw.parse()
        text = "".join(chunk.choices[0].text for chunk in parsed if chunk.choices) \
            if settings["stream"] else parsed.choices[0].text
    return text, raw.headers.get("x-zoo-replica")


def at_once(base: str, count: int, max_tokens: int,
            answered: threading.Semaphore | None = None, streamed: bool = False,
            started: threading.Semaphore | None = None) -> list[Any]:
    """`count` requests sent together: each one's (text, replica) or the exception raised;
    `started` is released as each one's response begins, `answered` as each one ends."""
    def one(index: int) -> Any:
        try:
            return ask(base, index, max_tokens, streamed, started)
        except Exception as exc:  # noqa: BLE001 (what the client saw is the result)
            return exc
        finally:
            if answered is not None:
                answered.release()

    with ThreadPoolExecutor(count) as pool:
        futures = [pool.submit(one, index) for index in range(count)]
        return [future.result(timeout=WAIT_S + 30) for future in futures]


@pytest.fixture(scope="module")
def plain_answers(chat: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[int, str]:
    """Plain `zoo serve`'s greedy answers to the same requests (max_tokens LONG: a shorter
    greedy answer is a prefix)."""
    server = Server([chat], tmp_path_factory.mktemp("plain") / "serve.log", "--api-key", KEY)
    try:
        answers = at_once(server.base, REQUESTS, LONG)
    finally:
        assert server.stop() == 0
    assert all(isinstance(answer, tuple) for answer in answers), answers
    return {index: text for index, (text, _) in enumerate(answers)}


def test_two_replicas_answer_as_zoo_serve(ray_server: RayServer,
                                          plain_answers: dict[int, str]) -> None:
    answers = at_once(ray_server.base, REQUESTS, LONG)
    failed = [answer for answer in answers if not isinstance(answer, tuple)]
    assert failed == [], failed
    assert {index: text for index, (text, _) in enumerate(answers)} == plain_answers
    assert sum(len(text) for text in plain_answers.values()) > REQUESTS * 10
    served = Counter(replica for _, replica in answers)
    assert len(served) == 2 and min(served.values()) > 0, served


def test_a_killed_replica_is_replaced_and_no_request_is_lost(
        ray_server: RayServer, plain_answers: dict[int, str]) -> None:
    before = {ray_server.replica() for _ in range(20)}
    replicas = ray_server.processes("ServeReplica")
    assert len(replicas) == 2, replicas
    answered = threading.Semaphore(0)
    with ThreadPoolExecutor(1) as killer:
        def kill_soon() -> None:
            # mid-load: 4 of the 64 answered (a batch of 4 per replica), the rest in flight
            for _ in range(4):
                assert answered.acquire(timeout=WAIT_S)
            os.kill(replicas[0], signal.SIGKILL)

        killed = killer.submit(kill_soon)
        started = time.monotonic()
        answers = at_once(ray_server.base, REQUESTS, LONG, answered)
        killed.result()
    assert time.monotonic() - started < WAIT_S + 30  # none hung
    done = [index for index, answer in enumerate(answers) if isinstance(answer, tuple)]
    errors = [answer for answer in answers if not isinstance(answer, tuple)]
    for index in done:  # a completed answer is whole
        assert answers[index][0] == plain_answers[index], index
    # the killed replica's requests: an HTTP error (not started) or a cut stream
    assert errors and all(isinstance(error, openai.InternalServerError | openai.APIConnectionError)
                          for error in errors), errors
    assert len(done) + len(errors) == REQUESTS
    deadline, now = time.monotonic() + 120, set()
    while time.monotonic() < deadline and not now - before:  # Ray starts a new one
        try:
            now |= {ray_server.replica() for _ in range(10)}
        except OSError:
            time.sleep(1)
    assert now - before, f"no new replica in 120 s: {ray_server.tail()}"
    assert at_once(ray_server.base, 8, 4) and \
        all(isinstance(answer, tuple) for answer in at_once(ray_server.base, 8, 4))


def test_sigterm_drains_the_requests_in_flight(ray_server: RayServer,
                                               plain_answers: dict[int, str]) -> None:
    """Streams only: each one's headers come as its replica takes it (decoding or queued), so
    the stop comes once all 24 are at a replica, none of them finished."""
    started, count = threading.Semaphore(0), 24
    before = set(ray_server.processes())
    with ThreadPoolExecutor(1) as stopper:
        def stop_when_all_started() -> int:
            for _ in range(count):
                assert started.acquire(timeout=WAIT_S)
            return ray_server.stop()

        status = stopper.submit(stop_when_all_started)
        answers = at_once(ray_server.base, count, LONG, streamed=True, started=started)
        assert status.result(timeout=150) == 0
    for index, answer in enumerate(answers):  # each finished, whole, though the server stopped
        assert isinstance(answer, tuple) and answer[0] == plain_answers[index], (index, answer)
    assert before and ray_server.processes() == []  # the Ray it started stopped with it
