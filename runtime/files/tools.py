"""Tool calls in a chat's text: how the tools and past calls are shown to a model whose chat
template does not read `tools` (DEFAULT_PROMPT), and the calls parsed back out of an answer.

A call is written as Hermes, Qwen2.5/Qwen3 and SmolLM3 templates ask, one block a call:
`<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>`."""

from __future__ import annotations

import json
import re
import uuid
from typing import Any

OPEN, CLOSE = "<tool_call>\n", "\n</tool_call>"
DEFAULT_PROMPT = (
    "You may call functions to answer. To call one, answer with nothing but\n"
    f'{OPEN}{{"name": <the function\'s name>, "arguments": <its arguments as a JSON object>}}'
    f"{CLOSE}\n(one block a call). The functions, as JSON schemas:\n")
CALLS = re.compile(re.escape(OPEN) + r"(.*?)" + re.escape(CLOSE), re.S)


def split_calls(text: str) -> tuple[str | None, list[dict[str, Any]]]:
    """The answer's text before its first call (None when empty) and its calls as OpenAI's
    tool_calls (arguments a JSON string); no calls where a block does not parse."""
    blocks = CALLS.findall(text)
    calls = []
    for block in blocks:
        try:
            call = json.loads(block)
        except ValueError:
            return text, []
        if not isinstance(call, dict) or not isinstance(call.get("name"), str):
            return text, []
        calls.append({"id": f"call_{uuid.uuid4().hex[:24]}", "type": "function",
                      "function": {"name": call["name"],
                                   "arguments": json.dumps(call.get("arguments", {}))}})
    if not calls:
        return text, []
    content = text[:text.index(OPEN)].strip()
    return content or None, calls


def presented(messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None,
              template_reads_tools: bool
              ) -> tuple[list[dict[str, Any]], list[dict[str, Any]] | None]:
    """The messages and tools to render. A template that reads `tools` gets them as they are
    (a call's arguments as an object, as transformers' templates expect); for another, the
    tools are a system message (DEFAULT_PROMPT), past calls are their blocks in the
    assistant's text and a tool's result a user message in <tool_response> tags."""
    if template_reads_tools:
        return [_with_argument_objects(message) for message in messages], tools
    out = []
    for message in messages:
        if message["role"] == "tool":
            out.append({"role": "user", "content": "<tool_response>\n"
                        f"{message['content']}\n</tool_response>"})
        elif message.get("tool_calls"):
            blocks = [OPEN + json.dumps({"name": call["function"]["name"], "arguments":
                                         _arguments(call["function"]["arguments"])}) + CLOSE
                      for call in message["tool_calls"]]
            out.append({"role": "assistant",
                        "content": "\n".join([message.get("content") or "", *blocks]).strip()})
        else:
            out.append({"role": message["role"], "content": message["content"]})
    if tools:
        described = "\n".join(json.dumps(tool["function"]) for tool in tools)
        system = DEFAULT_PROMPT + described
        if out and out[0]["role"] == "system":
            out[0] = {"role": "system", "content": out[0]["content"] + "\n\n" + system}
        else:
            out.insert(0, {"role": "system", "content": system})
    return out, None


def _with_argument_objects(message: dict[str, Any]) -> dict[str, Any]:
    if not message.get("tool_calls"):
        return message
    calls = [{**call, "function": {**call["function"],
                                   "arguments": _arguments(call["function"]["arguments"])}}
             for call in message["tool_calls"]]
    return {**message, "tool_calls": calls}


def _arguments(arguments: Any) -> Any:
    if isinstance(arguments, str):
        try:
            return json.loads(arguments)
        except ValueError:
            return arguments
    return arguments
