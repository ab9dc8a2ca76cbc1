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
HEAD = re.compile(r'\{"name":\s*"([^"\\]*)",\s*"arguments":\s*')  # a call's start
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
        head = HEAD.match(block)
        # the arguments' text as written (what a stream sends piece by piece), else as JSON
        written = block[head.end():block.rstrip().rfind("}")].strip() if head else ""
        arguments = written if head and _parses(written) else \
            json.dumps(call.get("arguments", {}))
        calls.append({"id": call_id(), "type": "function",
                      "function": {"name": call["name"], "arguments": arguments}})
    if not calls:
        return text, []
    content = text[:text.index(OPEN)].strip()
    return content or None, calls


def call_id() -> str:
    return f"call_{uuid.uuid4().hex[:24]}"


def _parses(text: str) -> bool:
    try:
        json.loads(text)
    except ValueError:
        return False
    return True


class CallStream:
    """An answer's calls as its text grows, as OpenAI streams them: per call, once its name is
    complete, a delta with its index, id and name; then its arguments' text as it comes,
    holding back what may be the call's end (`}` and the closing tag)."""

    def __init__(self) -> None:
        self.sent: list[tuple[str, int]] = []  # per call announced: its id, argument chars sent

    def deltas(self, text: str, final: bool = False) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        start, index = text.find(OPEN), 0
        while start >= 0:
            head = HEAD.match(text, start + len(OPEN))
            if head is None:
                break
            if index == len(self.sent):
                self.sent.append((call_id(), 0))
                out.append({"index": index, "id": self.sent[index][0], "type": "function",
                            "function": {"name": head.group(1), "arguments": ""}})
            end = text.find(CLOSE, head.end())
            if end >= 0:
                arguments = text[head.end():text.rfind("}", head.end(), end)].strip()
            else:
                safe = len(text) if final else len(text) - len(CLOSE) - 1
                arguments = text[head.end():max(head.end(), safe)]
            call, sent = self.sent[index]
            if len(arguments) > sent:
                out.append({"index": index, "function": {"arguments": arguments[sent:]}})
                self.sent[index] = (call, len(arguments))
            start = text.find(OPEN, end) if end >= 0 else -1
            index += 1
        return out


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
