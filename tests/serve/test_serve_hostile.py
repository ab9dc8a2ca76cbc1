"""Issue 43's hostile-traffic run: `zoo serve` on 127.0.0.1 over a tiny export (and one whose
chat template allocates gigabytes in one operation), sent each class of hostile request in
turn: header sections past the limit (a long URL, a huge header, thousands of headers, a huge
Authorization), a malformed request line, bytes left over after a body, lying and oversized
bodies, JSON bombs, field abuse (seed -1 past the queue's size, a tiny temperature, stop
strings at and past their limit), key variants, a memory-bomb template, a client gone
mid-stream. After each case: every answer is a JSON error object or a right answer, a good
request gets its right answer (within the socket timeout), and /metrics shows nothing
waiting or decoding. At the end: no traceback in the log, and the server's resident memory
grew by less than RSS_GROWTH. Bounded: each socket times out, the whole run is a few seconds
of requests."""

from __future__ import annotations

import json
import select
import socket
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from runtime.files.chat import CHAT_TEMPLATE
from tests.conftest import on_shared
from tests.support.serve import KEY, Server, scrape, with_tokenizer

pytestmark = on_shared("gpt-tiny")

RSS_GROWTH = 150 << 20  # bytes; a few hundred requests on a tiny export
GOOD = {"model": "chat", "prompt": [5, 6, 7], "max_tokens": 6, "temperature": 0}
# one operation that makes gigabytes between two of the sandbox's checks
BOMB = "{{ '%1000000000d' % 1 }}{% for m in messages %}{{ m['content'] }}{% endfor %}"


@pytest.fixture(scope="module")
def server(shared_export: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    root = tmp_path_factory.mktemp("hostile")
    chat = with_tokenizer(shared_export("gpt-tiny")[0], root / "chat")
    bomb = with_tokenizer(shared_export("gpt-tiny")[0], root / "bomb")
    (bomb / CHAT_TEMPLATE).write_text(BOMB, encoding="utf-8")
    served = Server([chat, bomb], root / "serve.log", "--api-key", KEY, "--max-queue", "4",
                    "--max-batch", "4")
    yield served
    if served.process.poll() is None:
        served.process.kill()
        served.process.wait()


def rss(server: Server) -> int:
    status = Path(f"/proc/{server.process.pid}/status").read_text()
    return int(next(line.split()[1] for line in status.splitlines()
                    if line.startswith("VmRSS:"))) * 1024


def exchange(server: Server, data: bytes) -> list[tuple[int, bytes]]:
    """Send raw bytes as a polite client would (stop sending once the server has answered),
    read until the server closes; every response in what came back: (status, body)."""
    with socket.create_connection(("127.0.0.1", server.port), timeout=20) as raw:
        for start in range(0, len(data), 8192):
            if select.select([raw], [], [], 0)[0]:
                break  # answered (and about to close): the rest would only be reset
            try:
                raw.sendall(data[start:start + 8192])
            except OSError:
                break
        reply = b""
        try:
            while part := raw.recv(65536):
                reply += part
        except ConnectionResetError:
            assert reply, "reset before any answer"  # the server's lingering close prevents it
    return responses(reply)


def responses(reply: bytes) -> list[tuple[int, bytes]]:
    """The HTTP/1.1 responses in a byte stream (each with a Content-Length, as these are)."""
    found = []
    while reply:
        head, _, rest = reply.partition(b"\r\n\r\n")
        status = int(head.split(b" ", 2)[1])
        headers = dict(line.split(b": ", 1) for line in head.split(b"\r\n")[1:])
        size = int(headers.get(b"content-length", len(rest)))
        found.append((status, rest[:size]))
        reply = rest[size:]
    return found


def post(path: str, body: bytes, *headers: str, key: str = KEY) -> bytes:
    lines = [f"POST {path} HTTP/1.1", "Host: x", f"Authorization: Bearer {key}",
             "Content-Type: application/json", *headers]
    if not any(h.lower().startswith("content-length") for h in headers):
        lines.append(f"Content-Length: {len(body)}")
    lines.append("Connection: close")
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body


def completion(**fields: Any) -> bytes:
    return post("/v1/completions", json.dumps({**GOOD, **fields}).encode())


def get(path: str, *headers: str) -> bytes:
    return ("\r\n".join([f"GET {path} HTTP/1.1", "Host: x", *headers, "Connection: close"])
            + "\r\n\r\n").encode("latin-1")


def error(status: int, code: str | None = None) -> Callable[[int, bytes], bool]:
    def check(got: int, body: bytes) -> bool:
        said = json.loads(body)["error"]
        return got == status and set(said) == {"message", "type", "param", "code"} \
            and (code is None or said["code"] == code)
    return check


def answered(got: int, body: bytes) -> bool:
    reply = json.loads(body)
    return got == 200 and "\x00" not in reply["choices"][0]["text"]


def streamed(got: int, body: bytes) -> bool:
    return got == 200 and b"data: [DONE]\n\n" in body and b'"error"' not in body  # chunked


LONG_STOPS = ["x" * 999 + str(i) for i in range(4)]
CASES: dict[str, tuple[bytes, list[Callable[[int, bytes], bool]]]] = {
    "a 64 KB URL": (get("/v1/models?" + "a" * 65536), [error(431, "headers_too_large")]),
    "a 1 MB header": (get("/health", "X-Big: " + "a" * (1 << 20)), [error(431)]),
    "10,000 headers": (get("/health", *[f"X-H{i}: 1" for i in range(10000)]), [error(431)]),
    "a 100 KB Authorization": (get("/v1/models", "Authorization: Bearer " + "k" * 102400),
                               [error(431)]),
    "a malformed request line": (b"GARBAGE\r\n\r\n", [error(400, "invalid_http")]),
    "bytes left after a body": (post("/v1/completions", b'{}GET / HTTP/9\r\n\r\n',
                                     "Content-Length: 2").replace(b"Connection: close\r\n", b""),
                                [error(400, "missing_required"), error(400, "invalid_http")]),
    "a lying length": (post("/v1/completions", b"{" * 10, "Content-Length: 99999999999"),
                       [error(413, "body_too_large")]),
    "a JSON bomb": (post("/v1/completions", b"[" * 200000), [error(400, "invalid_json")]),
    "a huge number": (post("/v1/completions", b'{"seed": 1' + b"0" * 100000 + b"}"),
                      [error(400, "invalid_json")]),
    "seed -1": (completion(seed=-1, temperature=1.0), [answered]),
    "temperature 1e-308": (completion(temperature=1e-308), [answered]),
    "four stop strings of 1000 characters, streamed": (
        completion(stop=LONG_STOPS, stream=True, max_tokens=60), [streamed]),
    "a stop string past the limit": (completion(stop="x" * 1001), [error(400)]),
    "a key and a no-break space": (completion().replace(KEY.encode(), KEY.encode() + b"\xa0"),
                                   [error(401, "invalid_api_key")]),
    "metrics without the key": (get("/metrics"), [error(401)]),
    "a template bomb": (post("/v1/chat/completions", json.dumps({
        "model": "bomb", "messages": [{"role": "user", "content": "w5"}]}).encode()),
        [error(400, "invalid_value")]),
}


def good_answer(server: Server) -> str:
    status, body = server.request("/v1/completions", GOOD)  # urlopen's timeout: the bound
    assert status == 200, body
    return body["choices"][0]["text"]


def idle(server: Server) -> dict[str, float]:
    """Each export's queue length and batch size from /metrics, once they are zero (a
    stream's row leaves at the step after its client went: bounded wait)."""
    deadline = time.monotonic() + 10
    while True:
        gauges = {f"{name}{labels}": value for (name, labels), value in scrape(server).items()
                  if name in ("zoo_queue_length", "zoo_batch_size") and value}
        if not gauges or time.monotonic() > deadline:
            return gauges
        time.sleep(0.05)


def test_hostile_traffic_leaves_the_server_serving_everyone(server: Server) -> None:
    expected = good_answer(server)
    before = rss(server)
    for name, (data, checks) in CASES.items():
        for _ in range(server_slots(name)):
            got = exchange(server, data)
            assert len(got) == len(checks), (name, got)
            for (status, body), check in zip(got, checks, strict=True):
                assert check(status, body), (name, status, body[:300])
        assert good_answer(server) == expected, name
        assert idle(server) == {}, name
    gone_mid_stream(server)
    assert good_answer(server) == expected and idle(server) == {}
    log = server.log.read_text()
    assert "Traceback" not in log, log[-3000:]
    assert rss(server) - before < RSS_GROWTH, (before, rss(server))


def server_slots(name: str) -> int:
    """How often a case is sent: past the queue and batch (4 + 4) for the one that leaked a
    place each time."""
    return 12 if name == "seed -1" else 1


def gone_mid_stream(server: Server) -> None:
    with socket.create_connection(("127.0.0.1", server.port), timeout=20) as raw:
        raw.sendall(completion(stream=True, max_tokens=100))
        assert raw.recv(4096).startswith(b"HTTP/1.1 200")
