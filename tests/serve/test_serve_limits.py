"""Issue 43's findings 2 and 3 below the server: the stop-string finder against the plain
definitions it replaced (text.find, and the longest proper prefix of a stop string that ends
the text), its work independent of the stop strings' length, and the sampler at temperatures
that once overflowed (numpy's argmax and softmax as the references); and the header limit on
a request that arrives whole, at the protocol (no socket: deterministic)."""

from __future__ import annotations

import random
import sys
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

from runtime.sampling import Sampling, _pick, pick_one
from runtime.serve.stops import StopFinder, common_prefix


def reference(text: str, stops: tuple[str, ...]) -> tuple[int | None, int]:
    """Where the first stop string begins (None: nowhere), else how many characters at the
    end of the text may begin one: the definitions the scheduler used before."""
    cuts = [text.find(stop) for stop in stops if stop in text]
    if cuts:
        return min(cuts), 0
    return None, max((size for stop in stops for size in range(1, len(stop))
                      if text.endswith(stop[:size])), default=0)


def growing(rng: random.Random, alphabet: str, steps: int) -> list[str]:
    """Texts as an answer's decoding gives them: mostly longer by a few characters, sometimes
    with the last one or two changed (a piece of a character completed)."""
    texts, text = [], ""
    for _ in range(steps):
        if text and rng.random() < 0.2:
            text = text[:-rng.randint(1, min(2, len(text)))]
        text += "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 3)))
        texts.append(text)
    return texts


@pytest.mark.parametrize("seed", range(40))
def test_the_finder_agrees_with_the_definitions_at_every_step(seed: int) -> None:
    rng = random.Random(seed)
    alphabet = "ab" if seed % 2 else "abc\ufffd"
    stops = tuple("".join(rng.choice(alphabet) for _ in range(rng.randint(1, 6)))
                  for _ in range(rng.randint(1, 4)))
    finder = StopFinder(stops)
    for text in growing(rng, alphabet, 60):
        found = finder.update(text)
        assert (found.cut, found.held) == reference(text, stops), (stops, text)
        if found.cut is not None:
            break  # the answer ends at its first stop string


def test_common_prefix_is_the_longest() -> None:
    for old, new in (("abc", "abcd"), ("abc", "abx"), ("abc", "x"), ("", "a"), ("abc", "ab")):
        expected = next((i for i, (a, b) in enumerate(zip(old, new, strict=False))
                         if a != b),
                        min(len(old), len(new)))
        assert common_prefix(old, new) == expected


def lines_run(work: Callable[[], Any]) -> int:
    """Python lines executed by `work` (a count, not a time: the same on any machine)."""
    count = 0

    def trace(frame: Any, event: str, arg: Any) -> Any:
        nonlocal count
        if event == "line":
            count += 1
        return trace

    sys.settrace(trace)
    try:
        work()
    finally:
        sys.settrace(None)
    return count


def test_a_tokens_work_does_not_grow_with_the_stop_strings_length() -> None:
    """Finding 2: a 1 MB stop string cost its length squared per token on the scheduler's
    thread. Now the stop strings are bounded (bodies.MAX_STOP_CHARS) and the work per token
    is in the token's new characters: four stop strings of 1000 characters cost what four of
    10 cost, within a few lines (the old check was ~100 times more for the long ones)."""
    text = "ab" * 200
    steps = [text[:end] for end in range(2, len(text) + 1, 2)]

    def feed(length: int) -> Callable[[], None]:
        finder = StopFinder(tuple("ab" * (length // 2 - 1) + "x" + str(i) for i in range(4)))
        return lambda: [finder.update(step) for step in steps]

    short, long = lines_run(feed(10)), lines_run(feed(1000))
    assert long <= short * 1.1 + 50, (short, long)


@pytest.mark.parametrize("temperature", [1e-308, 5e-324, 1e-300, 1e-30])
def test_a_tiny_temperature_is_greedy_not_nan(temperature: float) -> None:
    """Finding 3: logits / 1e-308 overflowed to inf, inf - inf to NaN, and the answer was NUL
    bytes. Any positive temperature now gives numpy's argmax where one logit leads by more
    than the temperature can blur."""
    rng = np.random.default_rng(0)
    logits = rng.normal(size=(8, 300)).astype(np.float32) * 10
    picked = _pick(logits, Sampling(temperature=temperature), rng.random(8))
    np.testing.assert_array_equal(picked, logits.argmax(axis=-1))
    for row in logits:
        assert pick_one(row, Sampling(temperature=temperature, top_p=0.5, top_k=5),
                        np.random.default_rng(1)) == int(row.argmax())


def test_sampling_draws_from_the_softmax_at_a_usual_temperature() -> None:
    """The shift by each row's maximum changes no probability: the token a uniform draw picks
    is the inverse CDF of softmax(logits / T) computed plainly."""
    rng = np.random.default_rng(3)
    logits = rng.normal(size=(64, 50)).astype(np.float32)
    uniforms = rng.random(64)
    scaled = logits.astype(np.float64) / 0.7
    probs = np.exp(scaled) / np.exp(scaled).sum(axis=-1, keepdims=True)
    expected = [int(np.searchsorted(np.cumsum(p) / p.sum(), u, side="right"))
                for p, u in zip(probs, uniforms, strict=True)]
    assert _pick(logits, Sampling(temperature=0.7), uniforms).tolist() == expected


class Transport:
    """What uvicorn's protocol writes, for one connection (no socket)."""

    def __init__(self) -> None:
        self.written, self.closed, self.ended = b"", False, False

    def write(self, data: bytes) -> None:
        self.written += data

    def can_write_eof(self) -> bool:
        return True

    def write_eof(self) -> None:
        self.ended = True

    def close(self) -> None:
        self.closed = True

    def is_closing(self) -> bool:
        return self.closed

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return ("127.0.0.1", 8000) if name in ("sockname", "peername") else default

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass


@pytest.mark.parametrize("request_bytes", [
    b"GET /v1/models?" + b"a" * 65536 + b" HTTP/1.1\r\nHost: x\r\n\r\n",
    b"GET /health HTTP/1.1\r\nHost: x\r\n" + b"X-H: 1\r\n" * 10000 + b"\r\n",
], ids=["a 64 KB URL", "10,000 headers"])
def test_a_header_section_past_the_limit_in_one_read_is_a_json_431(request_bytes: bytes
                                                                     ) -> None:
    """h11 bounds only a header section still incomplete: one that arrives whole in one read
    (as a fast client's on loopback may) passed it and reached the app. The server's protocol
    holds the limit on every parsed request: the app is never called, the answer is the JSON
    error object, and the connection ends after it."""
    import asyncio
    import json

    pytest.importorskip("uvicorn")
    from uvicorn.config import Config
    from uvicorn.server import ServerState

    from runtime.serve.http import MAX_HEADER_BYTES, JsonErrorsH11

    async def app(scope: Any, receive: Any, send: Any) -> None:
        raise AssertionError("the app was called")

    config = Config(app, http=JsonErrorsH11, h11_max_incomplete_event_size=MAX_HEADER_BYTES,
                    log_level="critical")
    config.load()
    loop = asyncio.new_event_loop()
    try:
        protocol = JsonErrorsH11(config, ServerState(), {}, _loop=loop)
        transport = Transport()
        protocol.connection_made(transport)  # type: ignore[arg-type]
        protocol.data_received(request_bytes)  # the whole request in one read
        loop.run_until_complete(asyncio.sleep(0))  # an app's task would start here
    finally:
        loop.close()
    head, _, body = transport.written.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 431 ")
    assert json.loads(body)["error"]["code"] == "headers_too_large"
    assert transport.ended  # lingering: the client still reads the answer
