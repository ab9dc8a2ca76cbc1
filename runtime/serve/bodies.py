"""The fields of an OpenAI request body, read and checked: a wrong one is an ApiError (400)
naming it. Only what the server does is accepted; an unknown field is refused, as OpenAI does,
rather than ignored (a client asking for `n=3` or `tools` would get something else)."""

from __future__ import annotations

import base64
import binascii
import json
import re
from dataclasses import dataclass
from typing import Any

from registry.errors import ZooError, first_line
from runtime.grammar.engine import Grammar, GrammarError, json_grammar
from runtime.prompts import check_text
from runtime.serve.errors import ApiError
from runtime.serve.logprobs import MAX_TOP_CHAT, MAX_TOP_COMPLETIONS

MAX_BODY = 1 << 20  # bytes; a chat history of a tiny-context model is far below it
MAX_STOPS = 4  # as OpenAI
# characters in one stop string: far past any real one (a closing tag, a role marker), and
# what a body may carry four of without its tables (runtime/serve/stops.py) mattering
MAX_STOP_CHARS = 1000
MAX_NESTING = 500  # brackets deep: under Python's JSON reader's limit, past any real body

SAMPLING = {"max_tokens", "temperature", "top_p", "seed", "stop", "stream", "stream_options",
            "n", "user"}
FIELDS = {
    "chat": {"model", "messages", "max_completion_tokens", "logprobs", "top_logprobs",
             "response_format", "tools", "tool_choice", "parallel_tool_calls"} | SAMPLING,
    "completions": {"model", "prompt", "logprobs", "echo"} | SAMPLING,
    "embeddings": {"model", "input", "encoding_format", "user"},
    "classify": {"model", "input", "user"},
}


def parse_body(raw: bytes, route: str) -> dict[str, Any]:
    """The JSON object of a request body, with only the fields `route` knows."""
    try:
        body = json.loads(raw)
    except RecursionError:
        field = too_deep(raw)
        raise ApiError(400, f"{field or 'the body'}: nested deeper than a body may be", field,
                       "invalid_json") from None
    except (ValueError, UnicodeDecodeError) as exc:  # long numbers
        raise ApiError(400, f"the body is not valid JSON ({first_line(exc)[:200]})", None,
                       "invalid_json") from None
    if not isinstance(body, dict):
        raise ApiError(400, "the body should be a JSON object", None, "invalid_json")
    unknown = sorted(set(body) - FIELDS[route])
    if unknown:
        raise ApiError(400, f"unrecognized request argument supplied: {unknown[0]}", unknown[0],
                       "unknown_parameter")
    return body


def too_deep(raw: bytes) -> str | None:
    """The top-level field of a JSON object whose value nests past `MAX_NESTING` (Python's
    reader gives up near 1,000 levels without saying where), or None."""
    depth, in_string, escaped, last, key, start = 0, False, False, "", None, 0
    for index, byte in enumerate(raw):
        if in_string:
            if escaped:
                escaped = False
            elif byte == 0x5C:  # backslash
                escaped = True
            elif byte == 0x22:  # the closing quote
                in_string = False
                if depth == 1:
                    last = raw[start:index].decode("utf-8", "replace")
        elif byte == 0x22:
            in_string, start = True, index + 1
        elif byte in b"[{":
            depth += 1
            if depth > MAX_NESTING:
                return key
        elif byte in b"]}":
            depth -= 1
        elif byte == 0x3A and depth == 1:  # the colon after a top-level key
            key = last[:64]
    return None


def wrong(name: str, expected: str) -> ApiError:
    return ApiError(400, f"{name}: expected {expected}", name, "invalid_type")


def read(body: dict[str, Any], name: str, kind: type | tuple[type, ...], default: Any = None,
         expected: str = "") -> Any:
    """body[name] when it has type `kind` (a bool is not a number), `default` when absent or
    null; `expected` says what it should be in the error."""
    value = body.get(name)
    if value is None:
        if default is ApiError:
            raise ApiError(400, f"{name}: a required field is missing", name, "missing_required")
        return default
    kinds = kind if isinstance(kind, tuple) else (kind,)
    if isinstance(value, bool) and bool not in kinds or not isinstance(value, kinds):
        raise wrong(name, expected or " or ".join(k.__name__ for k in kinds))
    return value


@dataclass(frozen=True)
class Sampled:
    """What a generating request asks for; max_tokens None = up to the context."""

    max_tokens: int | None
    temperature: float
    top_p: float
    seed: int | None
    stops: tuple[str, ...]
    stream: bool


def sampled(body: dict[str, Any]) -> Sampled:
    """The generation fields shared by /v1/chat/completions and /v1/completions. OpenAI's
    defaults: temperature 1 (send 0 for greedy), top_p 1."""
    if read(body, "n", int, 1) != 1:
        raise ApiError(400, "n: only n=1 is served", "n", "unsupported_value")
    name = "max_completion_tokens" if body.get("max_completion_tokens") is not None \
        else "max_tokens"
    # 0 only to score an echoed prompt (as OpenAI): nothing is generated
    least = 0 if body.get("echo") is True else 1
    expected = f"an integer >= {least}"
    max_tokens = read(body, name, int, None, expected)
    if max_tokens is not None and max_tokens < least:
        raise ApiError(400, f"{name}: expected {expected}, got {max_tokens}", name,
                       "invalid_value")
    temperature = float(read(body, "temperature", (int, float), 1.0, "a number in 0..2"))
    if not 0 <= temperature <= 2:
        raise ApiError(400, f"temperature: expected a number in 0..2, got {temperature}",
                       "temperature", "invalid_value")
    top_p = float(read(body, "top_p", (int, float), 1.0, "a number in (0, 1]"))
    if not 0 < top_p <= 1:
        raise ApiError(400, f"top_p: expected a number in (0, 1], got {top_p}", "top_p",
                       "invalid_value")
    stop = read(body, "stop", (str, list), (), "a string or a list of up to 4 strings")
    stops = (stop,) if isinstance(stop, str) else tuple(stop)
    if len(stops) > MAX_STOPS or not all(isinstance(s, str) and s for s in stops):
        raise wrong("stop", f"a string or a list of up to {MAX_STOPS} non-empty strings")
    longest = max(map(len, stops), default=0)
    if longest > MAX_STOP_CHARS:
        raise ApiError(400, f"stop: a stop string of {longest} characters, past the "
                       f"{MAX_STOP_CHARS} served", "stop", "invalid_value")
    read(body, "stream_options", dict, None, "an object")
    read(body, "user", str, None)
    # any integer, as OpenAI: -1 is a seed like 1 (runtime/sampling.py `Sampling.generator`)
    return Sampled(max_tokens, temperature, top_p, read(body, "seed", int, None),
                   stops, read(body, "stream", bool, False))


@dataclass(frozen=True)
class Scoring:
    """The log-probabilities a request asks for: `top` None for none, else the likeliest
    alternatives given a token; `echo` (/v1/completions) the prompt's as well."""

    top: int | None = None
    echo: bool = False

    @property
    def asked(self) -> bool:
        return self.top is not None or self.echo


def scoring(body: dict[str, Any], route: str) -> Scoring:
    """A chat's `logprobs: true` and `top_logprobs` (0..20, only with it), or a completion's
    `logprobs` (0..5) and `echo`, as OpenAI reads them."""
    if route == "chat":
        wanted = read(body, "logprobs", bool, False)
        top = read(body, "top_logprobs", int, None, f"an integer in 0..{MAX_TOP_CHAT}")
        if top is not None and not wanted:
            raise ApiError(400, "top_logprobs: needs logprobs: true", "top_logprobs",
                           "invalid_value")
        _within(top, "top_logprobs", MAX_TOP_CHAT)
        return Scoring((top or 0) if wanted else None)
    top = read(body, "logprobs", int, None, f"an integer in 0..{MAX_TOP_COMPLETIONS}")
    _within(top, "logprobs", MAX_TOP_COMPLETIONS)
    return Scoring(top, read(body, "echo", bool, False))


def _within(top: int | None, name: str, most: int) -> None:
    if top is not None and not 0 <= top <= most:
        raise ApiError(400, f"{name}: expected an integer in 0..{most}, got {top}", name,
                       "invalid_value")


def messages(body: dict[str, Any]) -> list[dict[str, Any]]:
    """The chat's {role, content} messages; a content given as parts keeps their text; an
    assistant's `tool_calls` (content may then be null) and a tool's `tool_call_id` kept."""
    given = read(body, "messages", list, ApiError, "a list of {role, content} objects")
    if not given:
        raise wrong("messages", "at least one message")
    out = []
    for index, message in enumerate(given):
        where = f"messages[{index}]"
        if not isinstance(message, dict) or not isinstance(message.get("role"), str):
            raise wrong(where, "an object with a string role")
        content = message.get("content")
        calls = message.get("tool_calls") if message["role"] == "assistant" else None
        if calls is not None:
            _check_calls(calls, f"{where}.tool_calls")
            content = content or ""
        if isinstance(content, list):
            if not all(isinstance(p, dict) and p.get("type") == "text"
                       and isinstance(p.get("text"), str) for p in content):
                raise wrong(f"{where}.content", "text parts ({type: text, text})")
            content = "".join(part["text"] for part in content)
        if not isinstance(content, str):
            raise wrong(f"{where}.content", "a string")
        try:
            check_text(content, f"{where}.content")  # JSON may carry a lone surrogate
        except ZooError as exc:
            raise ApiError(400, str(exc), f"{where}.content", "invalid_value") from None
        kept: dict[str, Any] = {"role": message["role"], "content": content}
        if calls:
            kept["tool_calls"] = calls
        if message["role"] == "tool":
            if not isinstance(message.get("tool_call_id"), str):
                raise wrong(f"{where}.tool_call_id", "the id of the call it answers")
            kept["tool_call_id"] = message["tool_call_id"]
        out.append(kept)
    return out


def _check_calls(calls: Any, where: str) -> None:
    """An assistant's past calls, as OpenAI sends them back."""
    if not isinstance(calls, list):
        raise wrong(where, "a list of calls")
    for index, call in enumerate(calls):
        function = call.get("function") if isinstance(call, dict) else None
        if not isinstance(function, dict) or not isinstance(function.get("name"), str) \
                or not isinstance(function.get("arguments"), str):
            raise wrong(f"{where}[{index}]", '{"id", "type": "function", "function": {name, '
                        "arguments (a JSON string)}}")


def prompt(body: dict[str, Any]) -> str | list[int]:
    """/v1/completions' prompt: a text or token ids (or a list of one of them: n=1)."""
    given = read(body, "prompt", (str, list), ApiError, "a string or a list of token ids")
    if isinstance(given, list) and len(given) == 1 and isinstance(given[0], str | list):
        given = given[0]
    if isinstance(given, str):
        return given
    if not given or not all(isinstance(t, int) and not isinstance(t, bool) for t in given):
        raise wrong("prompt", "a string or a non-empty list of token ids (one prompt)")
    return given


def inputs(body: dict[str, Any]) -> list[str] | list[list[int]]:
    """/v1/embeddings' input: a string, a list of strings, token ids or lists of them."""
    given = read(body, "input", (str, list), ApiError, "a string or a list of strings")
    if read(body, "encoding_format", str, "float") not in ("float", "base64"):
        raise wrong("encoding_format", "float or base64")
    if isinstance(given, str):
        return [given]
    if given and all(isinstance(t, int) and not isinstance(t, bool) for t in given):
        return [given]
    if given and (all(isinstance(t, str) for t in given) or all(
            isinstance(row, list) and row and all(isinstance(t, int) for t in row)
            for row in given)):
        return given
    raise wrong("input", "a string, a list of strings, or token ids")


DATA_URL = re.compile(r"data:image/[\w.+-]+;base64,")


def multimodal_inputs(body: dict[str, Any]) -> list[tuple[str, Any]] | None:
    """/v1/embeddings' input as Jina AI's embeddings API takes texts and images for its CLIP
    models (jina-clip): a list whose items are strings or objects {"text": ...} or {"image":
    base64, or a data:image/...;base64, URL}: [("text", str) | ("image", bytes)], in order.
    None where no item is an object (OpenAI's plain input). The server fetches nothing: an
    http URL is refused."""
    given = body.get("input")
    if not isinstance(given, list) or not any(isinstance(item, dict) for item in given):
        return None
    items: list[tuple[str, Any]] = []
    for index, item in enumerate(given):
        name = f"input[{index}]"
        if isinstance(item, str):
            item = {"text": item}
        if not isinstance(item, dict) or len(item) != 1 or not set(item) <= {"text", "image"}:
            raise wrong(name, 'a string, {"text": ...} or {"image": base64}')
        (kind, value), = item.items()
        if not isinstance(value, str) or not value:
            raise wrong(f"{name}.{kind}", "a non-empty string")
        if kind == "image":
            value = _image_bytes(value, f"{name}.image")
        items.append((kind, value))
    return items


def _image_bytes(value: str, name: str) -> bytes:
    if value.startswith(("http://", "https://")):
        raise ApiError(400, f"{name}: the server fetches no URL; give the image's bytes as "
                       "base64 (or a data:image/...;base64, URL)", name, "invalid_value")
    try:
        return base64.b64decode(DATA_URL.sub("", value, count=1), validate=True)
    except (ValueError, binascii.Error):
        raise wrong(name, "an image's bytes as base64") from None


def texts(body: dict[str, Any]) -> list[str]:
    """/v1/classify's input: a string or a non-empty list of strings."""
    given = read(body, "input", (str, list), ApiError, "a string or a list of strings")
    read(body, "user", str, None)
    if isinstance(given, str):
        return [given]
    if not given or not all(isinstance(text, str) for text in given):
        raise wrong("input", "a string or a non-empty list of strings")
    return given


def response_format(body: dict[str, Any]) -> Grammar | None:
    """/v1/chat/completions' response_format: text (free), json_object (any JSON object) or
    json_schema ({name, schema, strict, description}), as OpenAI reads it."""
    given = read(body, "response_format", dict, None, "an object with a type")
    if given is None:
        return None
    kind = given.get("type")
    if kind == "text" and set(given) == {"type"}:
        return None
    if kind == "json_object" and set(given) == {"type"}:
        return _grammar(json_grammar, None)
    if kind != "json_schema":
        raise wrong("response_format", "{type: text | json_object | json_schema}")
    spec = given.get("json_schema")
    if not isinstance(spec, dict) or set(given) != {"type", "json_schema"}:
        raise wrong("response_format.json_schema", "an object {name, schema, strict}")
    unknown = sorted(set(spec) - {"name", "schema", "strict", "description"})
    if unknown:
        raise ApiError(400, f"response_format.json_schema: unrecognized field {unknown[0]}",
                       "response_format", "unknown_parameter")
    if not isinstance(spec.get("name"), str) or not spec["name"]:
        raise wrong("response_format.json_schema.name", "a non-empty string")
    if not isinstance(spec.get("strict", False), bool | None):
        raise wrong("response_format.json_schema.strict", "true or false")
    schema = spec.get("schema", {})  # OpenAI: absent means any JSON value
    if not isinstance(schema, dict):
        raise wrong("response_format.json_schema.schema", "a JSON schema object")
    return _grammar(json_grammar, schema)


def _grammar(make: Any, source: Any) -> Grammar:
    try:
        return make(source, "response_format.json_schema.schema" if source is not None
                    else "response_format")
    except GrammarError as exc:
        raise ApiError(400, str(exc), "response_format", "invalid_value") from None
