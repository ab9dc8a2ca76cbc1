"""`zoo serve` under load (issue 36): 32 concurrent streaming clients send 200 requests to a
tiny export whose limits are smaller than the crowd (--max-batch 8 --max-queue 2), so
requests are batched, some wait and some are refused (429, then retried), and the longer
prompts are prefilled in chunks (--prefill-chunk 16). Every request completes once (none
lost, none duplicated) with exactly its greedy answer alone; clients that leave mid-stream
and the refused ones leave the server serving, its rows all freed."""

from __future__ import annotations

import http.client
import json
import queue
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.conftest import on_shared
from tests.support.serve import Server, scrape, with_tokenizer

openai = pytest.importorskip("openai")
pytestmark = on_shared("gpt-tiny")

CLIENTS, REQUESTS, MOST = 32, 200, 24  # MOST: the longest answer asked for


@pytest.fixture(scope="module")
def chat(tmp_path_factory: pytest.TempPathFactory, shared_export) -> Path:
    return with_tokenizer(shared_export("gpt-tiny")[0], tmp_path_factory.mktemp("load") / "chat")


def expected_texts(folder: Path, prompts: list[str]) -> dict[tuple[str, int], str]:
    """Each prompt's greedy answer alone, for every max_tokens: `zoo run`'s generate (as
    the Python API runs it), cut after n tokens (greedy: a shorter answer is a prefix)."""
    import zoo

    exported = zoo.load(folder)
    eos = exported.card["eos_token_id"]
    texts = {}
    for prompt in prompts:
        generated = exported.generate(prompt, zoo.GenerateOptions(max_new_tokens=MOST))[0]
        for n in range(1, MOST + 1):
            ids = generated.ids[:n]
            ids = ids[:ids.index(eos) + 1] if eos in ids else ids
            texts[prompt, n] = exported.tokenizer.decode(ids)
    return texts


def leave_mid_stream(port: int, prompt: str) -> int:
    """Start a long stream, read its first bytes, and hang up; its status."""
    body = json.dumps({"model": "chat", "prompt": prompt, "max_tokens": 100, "temperature": 0,
                       "stream": True})
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    connection.request("POST", "/v1/completions", body, {"Content-Type": "application/json"})
    response = connection.getresponse()
    if response.status == 200:
        response.read1(64)
    connection.close()
    return response.status


def test_two_hundred_streams_from_32_clients(chat: Path, tmp_path: Path) -> None:
    rng = np.random.default_rng(3)
    prompts = [" ".join(f"w{t}" for t in rng.integers(3, 250, n)) for n in rng.integers(1, 30, 20)]
    wanted = [(prompts[i % len(prompts)], int(rng.integers(1, MOST + 1)))
              for i in range(REQUESTS)]
    expected = expected_texts(chat, prompts)
    # prompts of 17 to 29 tokens are prefilled in two chunks, between the others' steps
    server = Server([chat], tmp_path / "serve.log", "--max-batch", "8", "--max-queue", "2",
                    "--prefill-chunk", "16")
    try:
        work: queue.Queue[int] = queue.Queue()
        for index in range(REQUESTS):
            work.put(index)
        answers: dict[int, list[dict[str, Any]]] = {}
        refused, failures, left = Counter(), [], []

        def client() -> None:
            api = openai.OpenAI(base_url=server.base + "/v1", api_key="none", max_retries=0)
            while True:
                try:
                    index = work.get_nowait()
                except queue.Empty:
                    return
                prompt, n = wanted[index]
                if index % 25 == 0:
                    left.append(leave_mid_stream(server.port, prompt))
                while True:
                    try:
                        stream = api.completions.create(model="chat", prompt=prompt,
                                                        max_tokens=n, temperature=0,
                                                        stream=True)
                        chunks = [chunk.model_dump() for chunk in stream]
                        break
                    except openai.RateLimitError:
                        refused[index] += 1
                        threading.Event().wait(0.02)
                    except Exception as exc:  # reported below, with the request
                        failures.append((index, repr(exc)))
                        return
                assert index not in answers
                answers[index] = chunks

        threads = [threading.Thread(target=client) for _ in range(CLIENTS)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=120)
        assert not failures, failures[:3]
        assert sorted(answers) == list(range(REQUESTS))  # every request answered once
        ids = [chunks[0]["id"] for chunks in answers.values()]
        assert len(set(ids)) == REQUESTS  # none answered twice under another's id
        for index, chunks in answers.items():
            prompt, n = wanted[index]
            assert {chunk["id"] for chunk in chunks} == {chunks[0]["id"]}
            text = "".join(chunk["choices"][0]["text"] for chunk in chunks if chunk["choices"])
            assert text == expected[prompt, n], (index, prompt, n)
            assert chunks[-1]["usage"]["completion_tokens"] <= n
        model = (("model", "chat"),)
        # The last rows leave the batch just after their final chunk is sent, and a row whose
        # client hung up leaves at the step after the server sees it go: wait for both, bounded.
        deadline = time.monotonic() + 30
        samples = scrape(server)
        while (samples["zoo_batch_size", model] or samples["zoo_queue_length", model]) \
                and time.monotonic() < deadline:
            threading.Event().wait(0.05)
            samples = scrape(server)
        assert samples["zoo_batch_size_max", model] == 8  # batched up to --max-batch
        assert samples["zoo_batch_size", model] == 0  # every row freed, left ones too
        assert samples["zoo_queue_length", model] == 0
        assert sum(refused.values()) > 0  # the queue limit was met, and survived
        assert samples["zoo_requests_total", (*model, ("route", "/v1/completions"),
                                              ("status", "429"))] == sum(refused.values()) \
            + left.count(429)
        status, reply = server.request("/v1/completions", {
            "model": "chat", "prompt": prompts[0], "max_tokens": 5, "temperature": 0})
        assert status == 200 and reply["choices"][0]["text"] == expected[prompts[0], 5]
    finally:
        code = server.stop()
    log = (tmp_path / "serve.log").read_text()
    assert code == 0 and "Traceback" not in log, log[-2000:]
    assert left.count(200) > 0 and "(stream client gone)" in log  # those that hung up
