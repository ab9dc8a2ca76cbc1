"""Tool calls on /v1/chat/completions: the request's `tools` and `tool_choice` read and
checked, and the grammar a call must follow (runtime/files/tools.py shows the tools to the
model and parses the calls back). With `required` or a named
function the whole answer is calls; with `auto` an answer is either text or calls, chosen by
its first character (`<` begins a call, which is then constrained to the end); `none` leaves
the answer free and never parses a call from it."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

from runtime.files.tools import CLOSE, OPEN
from runtime.grammar.engine import JSON_OPTIONS, Grammar, lark_grammar
from runtime.grammar.schema import SchemaError, check_schema
from runtime.serve.errors import ApiError

NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")  # OpenAI's rule for a function's name
MAX_TOOLS = 128  # as OpenAI


@dataclass(frozen=True)
class Tools:
    """A request's tools (OpenAI's objects, as sent) and how they may be called."""

    tools: list[dict[str, Any]]
    choice: str  # "auto", "none", "required", or a function's name
    parallel: bool

    def names(self) -> list[str]:
        return [tool["function"]["name"] for tool in self.tools]


def read_tools(body: dict[str, Any]) -> Tools | None:
    """`tools`, `tool_choice` and `parallel_tool_calls`, each refused by name (400)."""
    tools = body.get("tools")
    choice = body.get("tool_choice")
    parallel = body.get("parallel_tool_calls", True)
    if not isinstance(parallel, bool):
        raise _wrong("parallel_tool_calls", "true or false")
    if tools is None:
        if choice not in (None, "none"):
            raise _wrong("tool_choice", "no tool_choice without tools")
        return None
    if not isinstance(tools, list) or not 1 <= len(tools) <= MAX_TOOLS:
        raise _wrong("tools", f"a list of 1 to {MAX_TOOLS} tools")
    for index, tool in enumerate(tools):
        _check_tool(tool, f"tools[{index}]")
    names = [tool["function"]["name"] for tool in tools]
    if len(set(names)) < len(names):
        raise _wrong("tools", "functions of different names")
    return Tools(tools, _choice(choice, names), parallel)


def _check_tool(tool: Any, where: str) -> None:
    if not isinstance(tool, dict) or tool.get("type") != "function" \
            or not isinstance(tool.get("function"), dict):
        raise _wrong(where, '{"type": "function", "function": {name, description, parameters}}')
    function = tool["function"]
    unknown = sorted(set(function) - {"name", "description", "parameters", "strict"})
    if unknown:
        raise ApiError(400, f"{where}.function: unrecognized field {unknown[0]}", "tools",
                       "unknown_parameter")
    if not isinstance(function.get("name"), str) or not NAME.match(function["name"]):
        raise _wrong(f"{where}.function.name", "1 to 64 letters, digits, _ or -")
    if not isinstance(function.get("description", ""), str):
        raise _wrong(f"{where}.function.description", "a string")
    parameters = function.get("parameters", {"type": "object"})
    if not isinstance(parameters, dict):
        raise _wrong(f"{where}.function.parameters", "a JSON schema object")
    try:
        check_schema(parameters)
    except SchemaError as exc:
        raise ApiError(400, f"{where}.function.parameters: {exc}", "tools",
                       "invalid_value") from None


def _choice(choice: Any, names: list[str]) -> str:
    if choice is None:
        return "auto"
    if choice in ("auto", "none", "required"):
        return choice
    if isinstance(choice, dict) and choice.get("type") == "function" \
            and isinstance(choice.get("function"), dict) \
            and isinstance(choice["function"].get("name"), str):
        name = choice["function"]["name"]
        if name not in names:
            raise ApiError(400, f"tool_choice: no function {name[:64]!r} among the tools "
                           f"({', '.join(names)})", "tool_choice", "invalid_value")
        return name
    raise _wrong("tool_choice", 'auto, none, required or {"type": "function", "function": '
                 '{"name": ...}}')


def _wrong(name: str, expected: str) -> ApiError:
    return ApiError(400, f"{name}: expected {expected}", name.split("[")[0].split(".")[0],
                    "invalid_value")


def call_grammar(tools: Tools) -> Grammar | None:
    """The grammar of the answer: calls only (required, a named function), text or calls
    (auto), or None (none: free)."""
    if tools.choice == "none":
        return None
    chosen = [tool for tool in tools.tools
              if tools.choice in ("auto", "required") or tool["function"]["name"] == tools.choice]
    call = {"anyOf": [{
        "type": "object",
        "properties": {"name": {"const": tool["function"]["name"]},
                       "arguments": tool["function"].get("parameters", {"type": "object"})},
        "required": ["name", "arguments"], "additionalProperties": False}
        for tool in chosen], "x-guidance": JSON_OPTIONS}
    repeat = ' ("\\n" call)*' if tools.parallel and tools.choice in ("auto", "required") else ""
    calls = f"call{repeat}"
    start = f"start: {calls}" if tools.choice != "auto" else "start: free | calls\ncalls: " + \
        calls + '\nfree: /[^<](?s:.*)/'
    lark = (f"{start}\ncall: {json.dumps(OPEN)} body {json.dumps(CLOSE)}\n"
            f"body: %json {json.dumps(call)}\n")
    return lark_grammar(lark, "tools")  # checked when its matcher is made (Served.constraint)
