"""Structured output and tool calls on the real SmolLM2-135M-Instruct (the packaged GGUF,
imported and exported), through `zoo serve` and the `openai` client (slow: an export of 135M
parameters). Without the grammar its answers to the same request are not JSON."""

from __future__ import annotations

import json
from typing import Literal

import jsonschema
import pytest

from tests.support.helpers import zoo
from tests.support.serve import KEY, Server

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Server:
    from tests.conftest import packaged_smollm2

    folder = tmp_path_factory.mktemp("smollm2")
    for args in (("import", packaged_smollm2(), "-o", folder / "model"),
                 ("export", folder / "model", "--onnx", "--optimize", "-o", folder / "onnx")):
        result = zoo(*args)
        assert result.exit_code == 0, result.output
    server = Server([folder / "onnx"], folder / "serve.log", "--api-key", KEY, "--name", "smol")
    yield server
    server.stop()


def client(server: Server) -> object:
    import openai

    return openai.OpenAI(base_url=server.base + "/v1", api_key=KEY, max_retries=0)


def test_a_pydantic_answer_always_parses(server: Server) -> None:
    from pydantic import BaseModel

    class City(BaseModel):
        name: str
        country: str
        population: int
        continent: Literal["Europe", "Asia", "Africa", "America", "Oceania"]

    ask = [{"role": "user", "content": "Describe Paris as JSON."}]
    openai_client = client(server)
    free = openai_client.chat.completions.create(  # type: ignore[attr-defined]
        model="smol", messages=ask, temperature=0, max_tokens=80)
    with pytest.raises(ValueError):  # the model alone writes prose about JSON
        json.loads(free.choices[0].message.content)
    for temperature, seed in ((0, None), (1, 1), (1, 2)):
        answer = openai_client.chat.completions.parse(  # type: ignore[attr-defined]
            model="smol", messages=ask, response_format=City, temperature=temperature,
            seed=seed, max_tokens=120)
        if answer.choices[0].finish_reason == "stop":
            assert isinstance(answer.choices[0].message.parsed, City)
            jsonschema.validate(json.loads(answer.choices[0].message.content),
                                City.model_json_schema())
    assert answer.choices[0].message.parsed.name  # the last, seeded, finished too


def test_a_tool_call_round_trip(server: Server) -> None:
    tools = [{"type": "function", "function": {
        "name": "get_weather", "description": "The weather in a city now",
        "parameters": {"type": "object", "properties": {
            "city": {"type": "string"}, "unit": {"enum": ["celsius", "fahrenheit"]}},
            "required": ["city", "unit"], "additionalProperties": False}}}]
    ask = [{"role": "user", "content": "What is the weather in Paris?"}]
    openai_client = client(server)
    first = openai_client.chat.completions.create(  # type: ignore[attr-defined]
        model="smol", messages=ask, tools=tools, tool_choice="required",
        parallel_tool_calls=False, temperature=0, max_tokens=80)
    assert first.choices[0].finish_reason == "tool_calls"
    call = first.choices[0].message.tool_calls[0]
    arguments = json.loads(call.function.arguments)
    jsonschema.validate(arguments, tools[0]["function"]["parameters"])
    assert "paris" in arguments["city"].lower()
    history = [*ask, {"role": "assistant", "content": None, "tool_calls": [call.model_dump()]},
               {"role": "tool", "tool_call_id": call.id, "content": '{"temperature": 18}'}]
    final = openai_client.chat.completions.create(  # type: ignore[attr-defined]
        model="smol", messages=history, tools=tools, tool_choice="none", temperature=0,
        max_tokens=40)
    assert final.choices[0].finish_reason in ("stop", "length")
    assert final.choices[0].message.tool_calls is None and final.choices[0].message.content
