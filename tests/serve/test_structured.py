"""Structured output (issue 45): a JSON schema or a regular expression enforced at every step
by the grammar engine over the export's tokenizer, per row of the batch. The answers are
validated by `jsonschema` (the reference validator) and `re`, never by the engine that made
them; a random tiny model writes no JSON by itself, so an unmasked row shows."""

from __future__ import annotations

import json
import re
import threading
from pathlib import Path
from typing import Annotated, Literal

import jsonschema
import numpy as np
import pytest

from runtime.decoding import DecoderSession
from runtime.files.tokenizer import ByteTokenizer
from runtime.grammar.engine import Grammars, json_grammar, regex_grammar
from runtime.opening import open_export
from runtime.sampling import Sampling
from runtime.serve.scheduler import Job, Scheduler
from tests.conftest import SharedExport, on_shared
from tests.support.helpers import zoo
from tests.support.serve import (
    KEY,
    Collected,
    HeldAtThirdToken,
    Server,
    alone,
    scrape,
    with_byte_level_tokenizer,
    zoo_run,
)

pytestmark = on_shared("gpt-tiny")

# objects, arrays, enums, required keys, string patterns; every value bounded, so the grammar
# ends every answer well within MAX_TOKENS
SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "pattern": "^[A-Z][a-z]{0,5}$"},
        "count": {"type": "integer", "minimum": 0, "maximum": 999},
        "kind": {"enum": ["cat", "dog", "owl"]},
        "tags": {"type": "array", "items": {"type": "string", "maxLength": 4}, "maxItems": 3},
        "where": {"type": "object", "properties": {"x": {"type": "boolean"}},
                  "required": ["x"], "additionalProperties": False},
    },
    "required": ["name", "count", "kind", "where"],
    "additionalProperties": False,
}
MAX_TOKENS = 110  # gpt-tiny's context is 128
EOS = 258


def byte_grammars(runtime: object) -> Grammars:
    return Grammars(ByteTokenizer(), runtime.card, "gpt-tiny")  # type: ignore[attr-defined]


def answer_text(ids: list[int]) -> str:
    return bytes(token for token in ids if token < 256).decode("utf-8")


def test_a_mixed_batch_masks_only_the_constrained_rows(shared_export: SharedExport) -> None:
    """Constrained rows (greedy and sampled with seeds) validate against the schema and end
    by the grammar; the free rows beside them get their tokens alone, unmasked."""
    runtime = open_export(shared_export("gpt-tiny")[0])
    grammars, grammar = byte_grammars(runtime), json_grammar(SCHEMA, "schema")
    rng = np.random.default_rng(3)
    prompts = [rng.integers(3, 250, n).tolist() for n in (4, 9, 2, 7, 5, 3)]
    samplings = [Sampling(), Sampling(), Sampling(1.0, seed=1), Sampling(1.0, seed=2),
                 Sampling(1.0, top_p=0.9, seed=5), Sampling(1.0, seed=9)]
    constrained = [True, False, True, False, True, True]
    scheduler = Scheduler(runtime, 6, lambda ids: "", "test")
    sinks = [Collected() for _ in prompts]
    with scheduler.wake:
        for prompt, sampling, sink, yes in zip(prompts, samplings, sinks, constrained,
                                               strict=True):
            constraint = grammars.constraint(grammar) if yes else None
            scheduler.submit(Job(prompt, MAX_TOKENS if yes else 30, sampling, (), False, sink,
                                 constraint))
    for sink in sinks:
        assert sink.finished.wait(120), "a request never finished"
    for prompt, sampling, sink, yes in zip(prompts, samplings, sinks, constrained, strict=True):
        (name, completion), = [event for event in sink.events if event[0] != "piece"]
        assert name == "done"
        if not yes:
            assert completion.ids == alone(runtime, prompt, 30, sampling)
            continue
        assert completion.ids[-1] == EOS, "the grammar did not end the answer"
        jsonschema.validate(json.loads(answer_text(completion.ids)), SCHEMA)


def test_the_mask_only_removes_tokens(shared_export: SharedExport) -> None:
    """Greedy constrained: at every step the token is the unconstrained argmax wherever the
    grammar allows that one, and otherwise the best of those it allows."""
    runtime = open_export(shared_export("gpt-tiny")[0])
    constraint = byte_grammars(runtime).constraint(regex_grammar("[a-z ]{3,40}\\.", "regex"))
    job = Job([], 50, Sampling(), (), False, lambda event: None, constraint)
    session = DecoderSession(runtime)
    logits = session.prefill(np.array([[72, 101, 108, 108, 111]]), None)[0]
    kept = replaced = 0
    for _ in range(50):
        allowed = constraint.allowed()
        free = int(np.argmax(logits))
        token = job.choose(logits)
        if allowed[free]:
            assert token == free
            kept += 1
        else:
            assert allowed[token] and token == int(np.flatnonzero(allowed)[
                np.argmax(logits[allowed])])
            replaced += 1
        if token == EOS:
            break
        logits = session.step(np.array([token]))[0]
    assert kept and replaced  # both branches were checked


@pytest.fixture(scope="module")
def chat_server(shared_export: SharedExport, tmp_path_factory: pytest.TempPathFactory
                ) -> Server:
    folder = tmp_path_factory.mktemp("structured")
    export = with_byte_level_tokenizer(shared_export("gpt-tiny")[0], folder / "tiny")
    server = Server([export], folder / "serve.log", "--api-key", KEY)
    yield server
    server.stop()


def client(server: Server) -> object:
    import openai

    return openai.OpenAI(base_url=server.base + "/v1", api_key=KEY, max_retries=0)


def test_chat_completions_parse_with_a_pydantic_model(chat_server: Server) -> None:
    from pydantic import BaseModel, Field

    class Pet(BaseModel):
        name: str = Field(max_length=6)
        age: int = Field(ge=0, le=30)
        kind: Literal["cat", "dog"]
        friends: list[Annotated[str, Field(max_length=4)]] = Field(max_length=2)

    for temperature, seed in ((0, None), (1, 1), (1, 2)):  # the prompt: 6 tokens
        answer = client(chat_server).chat.completions.parse(  # type: ignore[attr-defined]
            model="tiny", messages=[{"role": "user", "content": "w5 w6"}], response_format=Pet,
            temperature=temperature, seed=seed, max_tokens=MAX_TOKENS)
        choice = answer.choices[0]
        assert choice.finish_reason == "stop"
        assert isinstance(choice.message.parsed, Pet)
        jsonschema.validate(json.loads(choice.message.content), Pet.model_json_schema())


def test_a_nested_schema_through_the_client_greedy_and_seeded(chat_server: Server) -> None:
    """Objects, arrays, enums, required keys and string patterns, at temperature 0 and 1
    with several seeds: every answer validates."""
    openai_client = client(chat_server)
    for temperature, seed in ((0, None), (1, 1), (1, 2), (1, 3)):
        answer = openai_client.chat.completions.create(  # type: ignore[attr-defined]
            model="tiny", messages=[{"role": "user", "content": "w5"}], max_tokens=MAX_TOKENS,
            temperature=temperature, seed=seed, response_format={
                "type": "json_schema", "json_schema": {"name": "n", "schema": SCHEMA,
                                                       "strict": True}})
        assert answer.choices[0].finish_reason == "stop"
        jsonschema.validate(json.loads(answer.choices[0].message.content), SCHEMA)


def test_json_object_and_a_cut_answer(chat_server: Server) -> None:
    openai_client = client(chat_server)
    free = {"type": "object", "properties": {"a": {"type": "string"}}, "required": ["a"]}
    cut = openai_client.chat.completions.create(  # type: ignore[attr-defined]
        model="tiny", messages=[{"role": "user", "content": "w5"}], max_tokens=6,
        temperature=0, response_format={"type": "json_schema",
                                        "json_schema": {"name": "a", "schema": free}})
    assert cut.choices[0].finish_reason == "length"  # cut by max_tokens: need not parse
    assert cut.choices[0].message.content.startswith('{"a":"')
    whole = openai_client.chat.completions.create(  # type: ignore[attr-defined]
        model="tiny", messages=[{"role": "user", "content": "w7"}], max_tokens=MAX_TOKENS,
        temperature=0, response_format={"type": "json_object"})
    if whole.choices[0].finish_reason == "stop":
        assert isinstance(json.loads(whole.choices[0].message.content), dict)
    else:  # an unbounded object may run to max_tokens; then it is a prefix of one
        assert whole.choices[0].message.content.startswith("{")


DEEP = '{"properties":{"a":' * 10_000 + "{}" + "}}" * 10_000
BAD = [
    ({"$ref": "https://example.com/schema.json"}, "is not inside the schema"),
    ({"type": "string", "pattern": "[^\\s\\S]"}, "Unsatisfiable"),
    ({"type": "array", "uniqueItems": True}, "'uniqueItems' cannot be enforced at "
     "$.uniqueItems"),
    ({"type": "object", "properties": {"a": {"type": "string", "contentEncoding": "base64"}}},
     "at $.properties.a.contentEncoding"),
    ({"type": "string", "pattern": "a(?=b)"}, "look-around"),
]


def test_schemas_that_cannot_be_enforced_are_refused_before_decoding(chat_server: Server
                                                                       ) -> None:
    steps = scrape(chat_server)[("zoo_decode_steps_total", (("model", "tiny"),))]
    for schema, said in BAD:
        status, body = chat_server.request("/v1/chat/completions", {
            "model": "tiny", "messages": [{"role": "user", "content": "w5"}],
            "response_format": {"type": "json_schema",
                                "json_schema": {"name": "x", "schema": schema}}})
        assert status == 400, body
        assert body["error"]["param"] == "response_format"
        assert said in body["error"]["message"], body
    raw = ('{"model":"tiny","messages":[{"role":"user","content":"w5"}],"response_format":'
           '{"type":"json_schema","json_schema":{"name":"x","schema":' + DEEP + "}}}")
    status, body = chat_server.request("/v1/chat/completions", raw.encode())
    assert (status, body["error"]["param"]) == (400, "response_format"), body
    for wrong in ({"type": "xml"}, {"type": "json_schema"},
                  {"type": "json_schema", "json_schema": {"schema": {}}}):
        status, body = chat_server.request("/v1/chat/completions", {
            "model": "tiny", "messages": [{"role": "user", "content": "w5"}],
            "response_format": wrong})
        assert status == 400 and body["error"]["param"].startswith("response_format"), body
    assert scrape(chat_server)[("zoo_decode_steps_total", (("model", "tiny"),))] == steps


def test_a_client_gone_mid_constrained_stream_frees_its_row_and_grammar(
        shared_export: SharedExport, tmp_path: Path) -> None:
    """Driven through the app's ASGI interface as tests/serve/test_serve_gone.py drives it:
    the hang-up arrives at the third token; the row leaves and its grammar state is freed."""
    import asyncio
    import gc
    import weakref

    import zoo
    from runtime.serve.app import make_app
    from runtime.serve.models import Served

    export = with_byte_level_tokenizer(shared_export("gpt-tiny")[0], tmp_path / "tiny")
    exported = zoo.load(export)
    served = Served("tiny", exported, max_queue=4, max_batch=4)
    held = HeldAtThirdToken(exported.runtime)
    served.scheduler = held.scheduler = Scheduler(held, 4, served.text, "tiny")
    app = make_app({"tiny": served}, None)
    schema = {"type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"]}
    body = json.dumps({"model": "tiny", "messages": [{"role": "user", "content": "w9"}],
                       "stream": True, "max_tokens": 100, "temperature": 0,
                       "response_format": {"type": "json_schema", "json_schema": {
                           "name": "t", "schema": schema}}}).encode()
    scope = {"type": "http", "http_version": "1.1", "method": "POST", "scheme": "http",
             "path": "/v1/chat/completions", "raw_path": b"/v1/chat/completions",
             "query_string": b"", "root_path": "", "client": ("127.0.0.1", 1),
             "server": ("127.0.0.1", 8000),
             "headers": [(b"content-type", b"application/json"),
                         (b"content-length", str(len(body)).encode())]}

    async def exchange() -> tuple[int, weakref.ref]:
        hung_up = asyncio.Event()
        messages = [{"type": "http.request", "body": body, "more_body": False}]

        async def receive() -> dict:
            if messages:
                return messages.pop()
            await hung_up.wait()
            return {"type": "http.disconnect"}

        async def send(message: dict) -> None:
            pass

        answering = asyncio.create_task(app(scope, receive, send))
        while not served.scheduler.rows:
            await asyncio.sleep(0.005)
        job = served.scheduler.rows[0]
        assert job.constraint is not None
        grammar = weakref.ref(job.constraint)
        while len(job.tokens) < 3:
            await asyncio.sleep(0.005)
        hung_up.set()
        await asyncio.wait_for(answering, 30)
        for _ in range(500):  # its last event gives its place back, on this loop
            if not served.admitted:
                break
            await asyncio.sleep(0.01)
        return len(job.tokens), grammar

    tokens, grammar = asyncio.run(exchange())
    assert tokens <= 4, f"it decoded {tokens - 3} tokens after its client left"
    for _ in range(200):  # the scheduler's thread drops the row after telling it
        gc.collect()
        if served.scheduler.gauges()[1] == 0 and grammar() is None:
            break
        threading.Event().wait(0.02)
    assert served.scheduler.gauges()[1] == 0 and served.admitted == 0
    assert grammar() is None, "its grammar state outlived its row"


def test_zoo_run_json_schema_and_regex(shared_export: SharedExport, tmp_path: Path) -> None:
    export = with_byte_level_tokenizer(shared_export("gpt-tiny")[0], tmp_path / "tiny")
    schema_file = tmp_path / "schema.json"
    schema_file.write_text(json.dumps(SCHEMA))
    for seed in ("1", "2"):
        out = zoo_run(export, "--text", "Hi", "--json-schema", schema_file, "--max-new-tokens",
                      str(MAX_TOKENS), "--temperature", "1", "--seed", seed)
        jsonschema.validate(json.loads(out.removeprefix("Hi")), SCHEMA)
    out = zoo_run(export, "--text", "Hi", "--regex", "[0-9]{3}-[a-z]{2,4}", "--max-new-tokens",
                  "20")
    assert re.fullmatch("[0-9]{3}-[a-z]{2,4}", out.removeprefix("Hi"))
    (tmp_path / "bad.json").write_text('{"type": "object",')
    (tmp_path / "keyword.json").write_text('{"type": "array", "uniqueItems": true}')
    for args, said in ((("--json-schema", tmp_path / "none.json"), "cannot be read"),
                       (("--json-schema", tmp_path / "bad.json"), "not valid JSON"),
                       (("--json-schema", tmp_path / "keyword.json"), "'uniqueItems'"),
                       (("--regex", "[^\\s\\S]"), "no text can match it"),
                       (("--regex", "a{5,2}"), "--regex"),
                       (("--regex", "a", "--beams", "2"), "--beams cannot be combined")):
        result = zoo("run", export, "--text", "Hi", *args)
        assert result.exit_code == 2, result.output
        assert said in result.output and len(result.output.strip().splitlines()) == 1, \
            result.output
