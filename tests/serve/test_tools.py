"""Tool calls (issue 45): `tools` and `tool_choice` on /v1/chat/completions with the real
`openai` client, streamed and not; the arguments validated by `jsonschema` against the
function's parameters; the tools rendered by a template that reads them exactly as
transformers' apply_chat_template renders them."""

from __future__ import annotations

import json

import jsonschema
import pytest

from runtime.files.chat_worker import render_chat
from runtime.files.tools import DEFAULT_PROMPT, presented
from tests.conftest import SharedExport, on_shared
from tests.support.serve import KEY, Server, with_byte_level_tokenizer

pytestmark = on_shared("gpt-tiny")

PARAMETERS = {"type": "object", "properties": {
    "city": {"type": "string", "maxLength": 6}, "unit": {"enum": ["c", "f"]}},
    "required": ["city", "unit"], "additionalProperties": False}
TOOLS = [{"type": "function", "function": {"name": "weather", "description": "Weather now",
                                           "parameters": PARAMETERS}},
         {"type": "function", "function": {"name": "time", "parameters": {
             "type": "object", "properties": {"zone": {"enum": ["utc", "cet"]}},
             "required": ["zone"], "additionalProperties": False}}}]
ASK = [{"role": "user", "content": "w5 w6"}]
# a template that reads the tools, short enough for gpt-tiny's 128 positions
SHORT = ("{% for t in tools or [] %}{{ t.function.name }} {% endfor %}{% for m in messages %}"
         "{{ m.role[0] }}:{{ m.content }} {% endfor %}{% if add_generation_prompt %}a:{% endif %}")


@pytest.fixture(scope="module")
def server(shared_export: SharedExport, tmp_path_factory: pytest.TempPathFactory) -> Server:
    folder = tmp_path_factory.mktemp("tools")
    export = with_byte_level_tokenizer(shared_export("gpt-tiny")[0], folder / "tiny", SHORT)
    server = Server([export], folder / "serve.log", "--api-key", KEY)
    yield server
    server.stop()


def client(server: Server) -> object:
    import openai

    return openai.OpenAI(base_url=server.base + "/v1", api_key=KEY, max_retries=0)


def check_calls(calls: list, names: set[str]) -> None:
    assert calls
    schemas = {tool["function"]["name"]: tool["function"]["parameters"] for tool in TOOLS}
    for call in calls:
        assert call.type == "function" and call.id.startswith("call_")
        assert call.function.name in names
        jsonschema.validate(json.loads(call.function.arguments), schemas[call.function.name])


def test_required_and_named_calls_streamed_and_not(server: Server) -> None:
    openai_client = client(server)
    for choice, names in (("required", {"weather", "time"}),
                          ({"type": "function", "function": {"name": "time"}}, {"time"})):
        for seed in (1, 2):
            answer = openai_client.chat.completions.create(  # type: ignore[attr-defined]
                model="tiny", messages=ASK, tools=TOOLS, tool_choice=choice, temperature=1,
                seed=seed, parallel_tool_calls=False, max_tokens=80)
            choice0 = answer.choices[0]
            assert choice0.finish_reason == "tool_calls"
            check_calls(choice0.message.tool_calls, names)
            assert len(choice0.message.tool_calls) == 1
        with openai_client.chat.completions.stream(  # type: ignore[attr-defined]
                model="tiny", messages=ASK, tools=TOOLS, tool_choice=choice, temperature=0,
                parallel_tool_calls=False, max_tokens=80) as stream:
            for _ in stream:
                pass
            final = stream.get_final_completion()
        assert final.choices[0].finish_reason == "tool_calls"
        check_calls(final.choices[0].message.tool_calls, names)


def test_a_streamed_call_comes_as_openai_deltas(server: Server) -> None:
    """The first delta of a call carries its index, id and name; its arguments follow in
    pieces as they are decoded, which joined are the arguments the whole answer gives."""
    answer = client(server).chat.completions.create(  # type: ignore[attr-defined]
        model="tiny", messages=ASK, tools=TOOLS, tool_choice={
            "type": "function", "function": {"name": "weather"}}, temperature=0,
        max_tokens=80, stream=True)
    deltas = [call for chunk in answer for choice in chunk.choices
              for call in choice.delta.tool_calls or []]
    first, *rest = deltas
    assert (first.index, first.function.name, first.function.arguments) == (0, "weather", "")
    assert first.id.startswith("call_") and all(d.id is None and d.index == 0 for d in rest)
    assert len(rest) > 3  # pieces, not the arguments in one
    arguments = "".join(d.function.arguments for d in rest)
    jsonschema.validate(json.loads(arguments), PARAMETERS)
    whole = client(server).chat.completions.create(  # type: ignore[attr-defined]
        model="tiny", messages=ASK, tools=TOOLS, tool_choice={
            "type": "function", "function": {"name": "weather"}}, temperature=0,
        max_tokens=80)
    assert whole.choices[0].message.tool_calls[0].function.arguments == arguments


def test_a_round_trip_call_result_answer(server: Server) -> None:
    openai_client = client(server)
    first = openai_client.chat.completions.create(  # type: ignore[attr-defined]
        model="tiny", messages=ASK, tools=TOOLS, tool_choice="required", temperature=0,
        parallel_tool_calls=False, max_tokens=80)
    call = first.choices[0].message.tool_calls[0]
    history = [*ASK, {"role": "assistant", "content": None, "tool_calls": [call.model_dump()]},
               {"role": "tool", "tool_call_id": call.id, "content": '{"c": 18}'}]
    final = openai_client.chat.completions.create(  # type: ignore[attr-defined]
        model="tiny", messages=history, tools=TOOLS, tool_choice="none", temperature=0,
        max_tokens=20)
    assert final.choices[0].message.tool_calls is None
    assert isinstance(final.choices[0].message.content, str)
    auto = openai_client.chat.completions.create(  # type: ignore[attr-defined]
        model="tiny", messages=history, tools=TOOLS, temperature=1, seed=4, max_tokens=80)
    message = auto.choices[0].message  # auto: text, or calls that are valid
    if auto.choices[0].finish_reason == "tool_calls":
        check_calls(message.tool_calls, {"weather", "time"})
    else:
        assert message.tool_calls is None and not message.content.startswith("<tool_call>")


def test_bad_tools_are_refused_before_decoding(server: Server) -> None:
    cases = [
        ({"tool_choice": {"type": "function", "function": {"name": "nope"}}}, "tool_choice"),
        ({"tools": [{"type": "function", "function": {"name": "bad name"}}]}, "tools"),
        ({"tools": [{"type": "retrieval"}]}, "tools"),
        ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {
            "type": "object", "uniqueItems": True}}}]}, "tools"),
        ({"response_format": {"type": "json_object"}}, "response_format"),
        ({"parallel_tool_calls": "yes"}, "parallel_tool_calls"),
    ]
    for extra, param in cases:
        body = {"model": "tiny", "messages": ASK, "tools": TOOLS, **extra}
        status, answer = server.request("/v1/chat/completions", body)
        assert status == 400 and answer["error"]["param"] == param, (extra, answer)


HERMES = ("{% if tools %}<tools>{% for t in tools %}{{ t.function | tojson }}{% endfor %}"
          "</tools>{% endif %}{% for m in messages %}<{{ m.role }}>{% if m.tool_calls %}"
          "{% for c in m.tool_calls %}{{ c.function.name }}({{ c.function.arguments | tojson }})"
          "{% endfor %}{% else %}{{ m.content }}{% endif %}</{{ m.role }}>{% endfor %}"
          "{% if add_generation_prompt %}<assistant>{% endif %}")
HISTORY = [*ASK, {"role": "assistant", "content": "", "tool_calls": [{
    "id": "call_1", "type": "function",
    "function": {"name": "weather", "arguments": '{"city": "Paris", "unit": "c"}'}}]},
    {"role": "tool", "tool_call_id": "call_1", "content": "18"}]


def test_a_template_that_reads_tools_renders_as_transformers(tmp_path: object) -> None:
    from transformers.utils.chat_template_utils import render_jinja_template

    template = tmp_path / "chat_template.jinja"  # type: ignore[operator]
    template.write_text(HERMES)
    messages, tools = presented(HISTORY, TOOLS, template_reads_tools=True)
    ours = render_chat(template, messages, tools=tools)
    # transformers' own rendering, with the call's arguments as the object it wants
    reference = [*ASK, {**HISTORY[1], "tool_calls": [{**HISTORY[1]["tool_calls"][0], "function": {
        "name": "weather", "arguments": {"city": "Paris", "unit": "c"}}}]}, HISTORY[2]]
    (theirs,), _ = render_jinja_template(conversations=[reference], tools=TOOLS,
                                         chat_template=HERMES, add_generation_prompt=True)
    assert ours == theirs
    assert '"Weather now"' in ours and 'weather({"city": "Paris", "unit": "c"})' in ours


def test_a_template_without_tools_gets_them_as_a_system_message() -> None:
    messages, tools = presented(HISTORY, TOOLS, template_reads_tools=False)
    assert tools is None
    assert messages[0]["role"] == "system" and messages[0]["content"].startswith(DEFAULT_PROMPT)
    assert json.dumps(TOOLS[0]["function"]) in messages[0]["content"]
    assert messages[2] == {"role": "assistant", "content": '<tool_call>\n{"name": "weather", '
                           '"arguments": {"city": "Paris", "unit": "c"}}\n</tool_call>'}
    assert messages[3] == {"role": "user", "content": "<tool_response>\n18\n</tool_response>"}
