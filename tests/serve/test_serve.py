"""`zoo serve` (issue 36, first step): a server started in a subprocess on a free port of
127.0.0.1 over the session's tiny exports, talked to with the real `openai` client (chat, with
and without streaming, completions, embeddings) and compared with `zoo run`'s answers; raw HTTP
for the refusals (401, bad JSON, a wrong type, an unknown model, a prompt past the context, a
body too large, a full queue) and for a client that leaves mid-stream; SIGTERM exits 0.
/v1/classify against `zoo.load(OUT).classify`; /metrics parsed and compared before and after."""

from __future__ import annotations

import base64
import json
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.conftest import on_shared
from tests.support.helpers import assert_one_line_error, zoo
from tests.support.serve import KEY, Server, scrape, with_tokenizer, zoo_run

openai = pytest.importorskip("openai")
pytestmark = on_shared("gpt-tiny")


@pytest.fixture(scope="module")
def exports(tmp_path_factory: pytest.TempPathFactory, shared_export,
            classifier_export: Path) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("serve")
    return {"chat": with_tokenizer(shared_export("gpt-tiny")[0], root / "chat"),
            "embedder": with_tokenizer(classifier_export, root / "embedder")}


@pytest.fixture(scope="module")
def server(exports: dict[str, Path], tmp_path_factory: pytest.TempPathFactory
           ) -> Iterator[Server]:
    served = Server(list(exports.values()), tmp_path_factory.mktemp("log") / "serve.log",
                    "--api-key", KEY)
    yield served
    if served.process.poll() is None:
        served.process.kill()
        served.process.wait()


@pytest.fixture(scope="module")
def client(server: Server) -> Any:
    return openai.OpenAI(base_url=server.base + "/v1", api_key=KEY, max_retries=0)


def test_models_lists_each_export_under_its_folder_name(client: Any) -> None:
    assert sorted(model.id for model in client.models.list()) == ["chat", "embedder"]


def test_chat_is_zoo_run_chat(client: Any, exports: dict[str, Path]) -> None:
    message = "w5 w6 w7"
    expected = zoo_run(exports["chat"], "--chat", message, "--max-new-tokens", "8")
    reply = client.chat.completions.create(
        model="chat", messages=[{"role": "user", "content": message}], max_tokens=8,
        temperature=0)
    assert reply.choices[0].message.content == expected
    assert expected  # words, not an empty reply compared with an empty one
    assert reply.usage.prompt_tokens == 3 + 2  # the words, the template's w1 and w2
    assert reply.usage.total_tokens == 5 + reply.usage.completion_tokens
    assert 1 <= reply.usage.completion_tokens <= 8


def test_streamed_chat_is_the_same_text_with_a_usage_chunk(client: Any,
                                                            exports: dict[str, Path]) -> None:
    expected = zoo_run(exports["chat"], "--chat", "w9 w4", "--max-new-tokens", "6")
    chunks = list(client.chat.completions.create(
        model="chat", messages=[{"role": "user", "content": "w9 w4"}],
        max_completion_tokens=6, temperature=0, stream=True))
    pieces = [c.choices[0].delta.content or "" for c in chunks if c.choices]
    assert len([p for p in pieces if p]) > 1  # streamed in pieces, not one block
    assert "".join(pieces) == expected
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] in ("stop", "length")
    assert chunks[-1].choices == [] and chunks[-1].usage.prompt_tokens == 4


def test_completion_is_zoo_run_text_for_text_and_ids(client: Any,
                                                     exports: dict[str, Path]) -> None:
    expected = zoo_run(exports["chat"], "--text", "w5 w6", "--max-new-tokens", "7")
    text = client.completions.create(model="chat", prompt="w5 w6", max_tokens=7, temperature=0)
    assert "w5 w6" + text.choices[0].text == expected  # zoo run prints prompt + continuation
    assert text.usage.prompt_tokens == 2
    ids = client.completions.create(model="chat", prompt=[5, 6], max_tokens=7, temperature=0)
    assert ids.choices[0].text == text.choices[0].text
    streamed = client.completions.create(model="chat", prompt="w5 w6", max_tokens=7,
                                         temperature=0, stream=True)
    assert "".join(c.choices[0].text for c in streamed if c.choices) == text.choices[0].text


def test_a_stop_string_cuts_the_text(client: Any) -> None:
    full = client.completions.create(model="chat", prompt="w5 w6", max_tokens=7,
                                     temperature=0).choices[0].text
    stop = full.split()[2]
    cut = client.completions.create(model="chat", prompt="w5 w6", max_tokens=7, temperature=0,
                                    stop=[stop]).choices[0]
    assert cut.text == full[:full.index(stop)] and cut.finish_reason == "stop"


def test_embeddings_are_zoo_run_json(client: Any, exports: dict[str, Path]) -> None:
    texts = ["w5 w6 w7", "w8"]
    expected = json.loads(zoo_run(exports["embedder"], "--text", texts[0], "--text", texts[1],
                                  "--json"))["embeddings"]
    for encoding in ("float", "base64"):  # the openai client's own default is base64
        got = client.embeddings.create(model="embedder", input=texts, encoding_format=encoding)
        vectors = [row.embedding for row in got.data]
        if encoding == "base64" and isinstance(vectors[0], str):
            vectors = [np.frombuffer(base64.b64decode(v), np.float32) for v in vectors]
        np.testing.assert_allclose(np.array(vectors, np.float32), np.array(expected),
                                   rtol=0, atol=1e-6)
    assert got.usage.prompt_tokens == 4  # one token a word (the word tokenizer adds none)


def error_of(reply: tuple[int, dict[str, Any]]) -> tuple[int, str | None, str | None]:
    status, body = reply
    assert set(body["error"]) == {"message", "type", "param", "code"}, body
    assert "Traceback" not in body["error"]["message"]
    return status, body["error"]["param"], body["error"]["code"]


def test_without_the_key_nothing_runs(server: Server) -> None:
    chat = {"model": "chat", "messages": [{"role": "user", "content": "w5"}], "max_tokens": 2}
    assert error_of(server.request("/v1/chat/completions", chat, key=None))[0] == 401
    assert error_of(server.request("/v1/chat/completions", chat, key="sk-wrong"))[0] == 401
    # the key is checked before the body is read: bad JSON without a key is a 401, not a 400
    assert error_of(server.request("/v1/completions", b"{", key=None))[0] == 401
    assert error_of(server.request("/v1/models", key=None, method="GET"))[0] == 401
    assert server.request("/health", key=None, method="GET")[0] == 200


@pytest.mark.parametrize(("path", "body", "expected"), [
    ("/v1/chat/completions", b"{not json", (400, None, "invalid_json")),
    ("/v1/chat/completions", b"[1, 2]", (400, None, "invalid_json")),
    ("/v1/chat/completions", b"[" * 100_000 + b"]" * 100_000, (400, None, "invalid_json")),
    ("/v1/completions", b'{"model": "chat", "prompt": "w5", "max_tokens": ' + b"9" * 5000
     + b"}", (400, None, "invalid_json")),
    ("/v1/chat/completions", {"model": "chat", "messages": [{"role": "user", "content": "w5"}],
                              "max_tokens": "5"}, (400, "max_tokens", "invalid_type")),
    ("/v1/chat/completions", {"model": "chat", "messages": "w5"},
     (400, "messages", "invalid_type")),
    ("/v1/chat/completions", {"model": "chat", "messages": [{"role": "user", "content": 5}]},
     (400, "messages[0].content", "invalid_type")),
    ("/v1/chat/completions", {"model": "chat", "messages": [{"role": "user", "content": "w"}],
                              "n": 2}, (400, "n", "unsupported_value")),
    ("/v1/chat/completions", {"model": "chat", "messages": [{"role": "user",
                                                             "content": "w5 \ud800"}]},
     (400, "messages[0].content", "invalid_value")),
    ("/v1/completions", {"model": "chat", "prompt": "w5 \udc80"}, (400, "prompt", "invalid_value")),
    ("/v1/embeddings", {"model": "embedder", "input": ["w5", "\ud800"]},
     (400, "input", "invalid_value")),
    ("/v1/chat/completions", {"model": "chat", "messages": [], "audio": {}},
     (400, "audio", "unknown_parameter")),
    ("/v1/completions", {"model": "gpt-9", "prompt": "w5"}, (404, "model", "model_not_found")),
    ("/v1/completions", {"model": "chat", "prompt": " ".join(["w5"] * 200)},
     (400, "prompt", "context_length_exceeded")),
    ("/v1/completions", {"model": "chat", "prompt": "w5 w6", "max_tokens": 127},
     (400, "max_tokens", "context_length_exceeded")),
    ("/v1/completions", {"model": "chat", "prompt": [5, 999]}, (400, "prompt", "invalid_value")),
    ("/v1/completions", {"model": "chat", "prompt": "w5", "temperature": True},
     (400, "temperature", "invalid_type")),
    ("/v1/embeddings", {"model": "chat", "input": "w5"}, (400, "model", "invalid_value")),
    ("/v1/embeddings", {"model": "embedder", "input": [[]]}, (400, "input", "invalid_type")),
    ("/v1/classify", {"model": "embedder", "input": 5}, (400, "input", "invalid_type")),
    ("/v1/classify", {"model": "embedder", "input": []}, (400, "input", "invalid_type")),
    ("/v1/classify", {"model": "embedder", "input": ["w5", [5]]},
     (400, "input", "invalid_type")),
    ("/v1/classify", {"model": "embedder"}, (400, "input", "missing_required")),
    ("/v1/classify", {"model": "embedder", "input": "w5", "encoding_format": "float"},
     (400, "encoding_format", "unknown_parameter")),
    ("/v1/classify", {"model": "gpt-9", "input": "w5"}, (404, "model", "model_not_found")),
    ("/v1/classify", {"model": "chat", "input": "w5"}, (400, "model", "invalid_value")),
    ("/v1/classify", {"model": "embedder", "input": "w5 \ud800"},
     (400, "input", "invalid_value")),
])
def test_bad_requests_get_an_error_naming_the_field(server: Server, path: str,
                                                    body: bytes | dict, expected: tuple) -> None:
    assert error_of(server.request(path, body)) == expected


def test_a_body_over_the_limit_is_refused_before_it_is_read(server: Server) -> None:
    """A declared length past 1 MiB: 413 at once (a client sending it all would meet a closed
    connection, so the bytes are only announced here)."""
    with socket.create_connection(("127.0.0.1", server.port), timeout=10) as raw:
        raw.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer "
                    + KEY.encode() + b"\r\nContent-Length: " + str((1 << 20) + 1).encode()
                    + b"\r\n\r\n{")
        reply = b""
        while b"}}" not in reply and (part := raw.recv(4096)):
            reply += part
    head, _, body = reply.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 413")
    assert json.loads(body)["error"]["code"] == "body_too_large"


def test_unknown_paths_get_an_error_object(server: Server) -> None:
    assert error_of(server.request("/v1/nowhere", {}))[0] == 404


def test_a_client_gone_mid_stream_leaves_the_server_serving(server: Server) -> None:
    body = json.dumps({"model": "chat", "prompt": "w5", "max_tokens": 100, "temperature": 0,
                       "stream": True}).encode()
    for _ in range(3):
        with socket.create_connection(("127.0.0.1", server.port)) as raw:
            raw.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer "
                        + KEY.encode() + b"\r\nContent-Type: application/json\r\n"
                        b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
            assert raw.recv(64).startswith(b"HTTP/1.1 200")
    status, reply = server.request("/v1/completions", {"model": "chat", "prompt": "w5",
                                                       "max_tokens": 3, "temperature": 0})
    assert status == 200 and reply["usage"]["completion_tokens"] >= 1


def test_a_full_queue_gets_429_and_sigterm_exits_0(exports: dict[str, Path],
                                                   tmp_path: Path) -> None:
    """--max-batch 1 --max-queue 0: one request runs, one arriving meanwhile is refused; every
    request gets 200 or 429, none is lost, and after SIGTERM the server exits 0 with no
    traceback."""
    server = Server([exports["chat"]], tmp_path / "serve.log", "--max-queue", "0",
                    "--max-batch", "1")
    try:
        body = {"model": "chat", "prompt": "w5", "max_tokens": 120, "temperature": 0}
        statuses: list[int] = []

        def ask() -> None:
            status, reply = server.request("/v1/completions", body, key=None)
            if status == 429:
                assert reply["error"]["type"] == "rate_limit_error"
            statuses.append(status)

        threads = [threading.Thread(target=ask) for _ in range(12)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert sorted(set(statuses)) == [200, 429] and len(statuses) == 12
        assert server.request("/v1/completions", body, key=None)[0] == 200
    finally:
        code = server.stop()
    log = (tmp_path / "serve.log").read_text()
    assert code == 0, log
    assert "Traceback" not in log
    assert "POST /v1/completions 429 0 tokens" in log and "POST /v1/completions 200 " in log


def test_each_request_got_one_log_line_and_no_traceback(server: Server) -> None:
    """After the tests above (a module's tests run in order): method, path, status, tokens and
    time a line, refusals included, and no traceback for any of the bad requests."""
    assert server.request("/v1/models", key=None, method="GET")[0] == 401
    log = server.log.read_text()
    assert "Traceback" not in log
    lines = [line.split(" ", 2)[2] for line in log.splitlines() if " /v1/" in line]
    assert lines[-1].startswith("GET /v1/models 401 0 tokens ") and lines[-1].endswith(" ms")
    assert any(line.startswith("POST /v1/chat/completions 200 ") for line in lines)
    assert any(line.startswith("POST /v1/completions 404 0 tokens") for line in lines)


def test_bad_command_lines_are_one_line_errors(exports: dict[str, Path]) -> None:
    def serve(*args: str | Path) -> Any:  # an address no server binds: a missed check fails
        return zoo("serve", "--host", "256.0.0.1", *args)

    assert_one_line_error(serve(exports["chat"], "--name", "a", "--name", "b"),
                          "--name", "2 names for 1 exports")
    assert_one_line_error(serve(exports["chat"], exports["chat"]), "two exports", "--name")
    assert_one_line_error(serve(exports["chat"], "--max-queue", "-1"), "--max-queue")
    assert_one_line_error(serve(exports["chat"], "--max-batch", "0"), "--max-batch 0")
    assert_one_line_error(serve(exports["chat"], "--prefill-chunk", "0"), "--prefill-chunk 0")
    assert_one_line_error(serve(exports["chat"], "--prefix-cache-mb", "-1"),
                          "--prefix-cache-mb -1")
    assert_one_line_error(serve(exports["chat"], "--port", "70000"), "--port 70000")


def test_sampling_with_a_seed_is_zoo_runs(client: Any, exports: dict[str, Path]) -> None:
    """temperature, top_p and seed reach the sampler as `zoo run`'s options do."""
    expected = zoo_run(exports["chat"], "--text", "w5 w6", "--max-new-tokens", "10",
                       "--temperature", "1.5", "--top-p", "0.95", "--seed", "3")
    got = [client.completions.create(model="chat", prompt="w5 w6", max_tokens=10,
                                     temperature=1.5, top_p=0.95, seed=seed).choices[0].text
           for seed in (3, 4)]
    assert "w5 w6" + got[0] == expected
    assert got[1] != got[0]  # the seed is used, not a fixed one


def test_classify_is_the_python_apis(server: Server, exports: dict[str, Path]) -> None:
    import zoo

    texts = ["w5 w6 w7", "w8"]
    expected = zoo.load(exports["embedder"]).classify(texts)
    status, reply = server.request("/v1/classify", {"model": "embedder", "input": texts})
    assert status == 200 and reply["object"] == "list" and reply["model"] == "embedder"
    assert [row["index"] for row in reply["data"]] == [0, 1]
    for row, probabilities in zip(reply["data"], expected, strict=True):
        assert row["object"] == "classification"
        assert list(row["probabilities"]) == list(probabilities)  # the labels, likeliest first
        np.testing.assert_allclose(list(row["probabilities"].values()),
                                   list(probabilities.values()), rtol=0, atol=1e-6)
        assert row["label"] == max(probabilities, key=probabilities.__getitem__)
    assert reply["usage"] == {"prompt_tokens": 4, "total_tokens": 4}  # a token a word
    one = server.request("/v1/classify", {"model": "embedder", "input": "w8"})[1]
    assert one["data"][0]["probabilities"] == reply["data"][1]["probabilities"]


def test_metrics_move_by_exactly_the_requests_made(server: Server) -> None:
    before = scrape(server)
    start = time.perf_counter()
    chat = server.request("/v1/chat/completions", {
        "model": "chat", "messages": [{"role": "user", "content": "w5 w6"}], "max_tokens": 4,
        "temperature": 0})[1]["usage"]
    elapsed = time.perf_counter() - start
    classified = server.request("/v1/classify", {"model": "embedder", "input": "w5 w6 w7"})
    embedded = server.request("/v1/embeddings", {"model": "embedder", "input": ["w5", "w6 w7"]})
    assert server.request("/v1/completions", {"model": "gpt-9", "prompt": "w5"})[0] == 404
    assert server.request("/v1/classify", {"model": "embedder", "input": "w5"}, key=None)[0] \
        == 401
    assert server.request("/v1/nowhere", {})[0] == 404
    after = scrape(server)

    def requests(model: str, route: str, status: int) -> tuple:
        return "zoo_requests_total", (("model", model), ("route", route),
                                      ("status", str(status)))

    def tokens(model: str, kind: str) -> tuple:
        return "zoo_tokens_total", (("kind", kind), ("model", model))

    ttft = ("model", "chat")
    moved = {key: after[key] - before.get(key, 0) for key in after
             if after[key] != before.get(key, 0)}
    expected = {requests("chat", "/v1/chat/completions", 200): 1,
                requests("embedder", "/v1/classify", 200): 1,
                requests("embedder", "/v1/embeddings", 200): 1,
                requests("", "/v1/completions", 404): 1, requests("", "/v1/classify", 401): 1,
                requests("", "other", 404): 1, requests("", "/metrics", 200): 1,  # the first
                tokens("chat", "prompt"): chat["prompt_tokens"],
                tokens("chat", "completion"): chat["completion_tokens"],
                tokens("embedder", "prompt"): classified[1]["usage"]["prompt_tokens"]
                + embedded[1]["usage"]["prompt_tokens"],
                ("zoo_time_to_first_token_seconds_count", (ttft,)): 1,
                # a prompt shorter than a block of the prefix cache: every token missed
                ("zoo_prefix_cache_miss_tokens_total", (ttft,)): chat["prompt_tokens"],
                ("zoo_time_to_first_token_seconds_bucket", (("le", "+Inf"), ttft)): 1}
    # alone in its batch: a step a token after the first (which its prefill gives)
    steps = chat["completion_tokens"] - 1
    if steps:
        expected |= {("zoo_decode_steps_total", (ttft,)): steps,
                     ("zoo_decoded_rows_total", (ttft,)): steps}
    ttft_sum = moved.pop(("zoo_time_to_first_token_seconds_sum", (ttft,)))
    assert 0 < ttft_sum <= elapsed
    buckets = {key: value for key, value in moved.items()
               if key[0] == "zoo_time_to_first_token_seconds_bucket" and key not in expected}
    assert set(buckets.values()) <= {1}  # the buckets at or past the time, none before it
    assert {key: value for key, value in moved.items() if key not in buckets} == expected
    for model in ("chat", "embedder"):  # idle now
        assert after["zoo_queue_length", (("model", model),)] == 0
        assert after["zoo_batch_size", (("model", model),)] == 0


def test_batch_size_and_queue_length_while_requests_run(server: Server) -> None:
    body = {"model": "chat", "prompt": "w5", "max_tokens": 120, "temperature": 0}
    # six answers one after another: long enough for several scrapes on a busy machine
    threads = [threading.Thread(target=server.request, args=("/v1/completions", body))
               for _ in range(6)]
    for thread in threads:
        thread.start()
    seen = set()
    while any(thread.is_alive() for thread in threads):
        samples = scrape(server)
        seen.add((samples["zoo_batch_size", (("model", "chat"),)],
                  samples["zoo_queue_length", (("model", "chat"),)]))
    for thread in threads:
        thread.join()
    # a request waits from its admission until the scheduler's next step takes it: all six
    # may wait at once; all six may decode together (--max-batch 16)
    assert all(0 <= batch <= 6 and 0 <= queue <= 6 - batch for batch, queue in seen), seen
    assert any(batch >= 2 for batch, _ in seen), seen  # decoded together, not one at a time
    after = scrape(server)
    assert after["zoo_batch_size_max", (("model", "chat"),)] >= 2


def test_concurrent_embeddings_are_each_their_own(server: Server) -> None:
    """Requests gathered into one length-sorted batch (runtime/serve/embedder.py) each get
    their own rows back, in order, as the request alone gets them."""
    inputs = [[" ".join(f"w{5 + (i * 7 + j) % 200}" for j in range(n)) for n in (i % 5 + 1,
              9 - i % 4)] for i in range(8)]
    alone = [server.request("/v1/embeddings", {"model": "embedder", "input": texts})[1]
             for texts in inputs]
    got: dict[int, dict[str, Any]] = {}

    def ask(index: int) -> None:
        got[index] = server.request("/v1/embeddings", {"model": "embedder",
                                                       "input": inputs[index]})[1]

    threads = [threading.Thread(target=ask, args=(i,)) for i in range(len(inputs))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    for index, reply in enumerate(alone):
        assert got[index]["usage"] == reply["usage"]
        np.testing.assert_allclose([row["embedding"] for row in got[index]["data"]],
                                   [row["embedding"] for row in reply["data"]], rtol=0,
                                   atol=1e-6)
