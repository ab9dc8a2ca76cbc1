"""A non-streaming client that hangs up while its answer is generated (issue 36): its row
leaves the batch at the next step, as a stream's does, instead of decoding to max_tokens.
Driven through the app's ASGI interface, so the hang-up is the `http.disconnect` message a
server delivers, at a known moment; each step is slowed so that moment is mid-answer."""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import pytest

from tests.conftest import SharedExport, on_shared
from tests.support.serve import HeldAtThirdToken

pytest.importorskip("starlette")
pytestmark = on_shared("gpt-tiny")

MAX_TOKENS = 100


def test_a_client_gone_before_its_answer_frees_its_row(shared_export: SharedExport) -> None:
    import zoo
    from runtime.serve.app import make_app
    from runtime.serve.models import Served
    from runtime.serve.scheduler import Scheduler

    exported = zoo.load(shared_export("gpt-tiny")[0])
    served = Served("tiny", exported, max_queue=4, max_batch=4)
    held = HeldAtThirdToken(exported.runtime)
    served.scheduler = held.scheduler = Scheduler(held, 4, served.text, "tiny")
    app = make_app({"tiny": served}, None)
    body = json.dumps({"model": "tiny", "prompt": [5, 6, 7], "max_tokens": MAX_TOKENS,
                       "temperature": 0}).encode()
    scope = {"type": "http", "http_version": "1.1", "method": "POST", "scheme": "http",
             "path": "/v1/completions", "raw_path": b"/v1/completions", "query_string": b"",
             "root_path": "", "client": ("127.0.0.1", 1), "server": ("127.0.0.1", 8000),
             "headers": [(b"content-type", b"application/json"),
                         (b"content-length", str(len(body)).encode())]}
    sent: list[dict[str, Any]] = []

    async def exchange() -> list[int]:
        hung_up = asyncio.Event()
        messages = [{"type": "http.request", "body": body, "more_body": False}]

        async def receive() -> dict[str, Any]:
            if messages:
                return messages.pop()
            await hung_up.wait()
            return {"type": "http.disconnect"}

        async def send(message: dict[str, Any]) -> None:
            sent.append(message)

        answering = asyncio.create_task(app(scope, receive, send))
        while not served.scheduler.rows:  # decoding: its row is in the batch
            await asyncio.sleep(0.005)
        job = served.scheduler.rows[0]
        while len(job.tokens) < 3:
            await asyncio.sleep(0.005)
        hung_up.set()
        await asyncio.wait_for(answering, 30)
        return job.tokens

    tokens = asyncio.run(exchange())
    assert len(tokens) <= 4, f"it decoded {len(tokens) - 3} tokens after its client left"
    deadline = time.monotonic() + 10  # the scheduler's thread drops the row after telling it
    while served.scheduler.gauges()[1] and time.monotonic() < deadline:
        time.sleep(0.005)
    assert served.scheduler.gauges()[1] == 0  # no row left decoding
    assert served.admitted == 0  # its place in the queue given back
    assert sent[0]["status"] == 499
