"""Command-line options declared once, on the fields of the options dataclasses they fill:
`opset: int = option(18, "ONNX opset (18 to 25).")` is both the field and `zoo export --opset`
(its help, choices, default and flags); commands/shell.py makes the click options.

Neither torch nor click is imported here, so any layer's options class may use it."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import MISSING, Field, field
from typing import Any

import yaml

from registry.errors import first_line

KEY = "zoo.option"  # the metadata key a field's command-line spec sits under


def option(default: Any = MISSING, help: str = "", *, flags: tuple[str, ...] = (),  # noqa: A002
           choices: Iterable[str] | Callable[[], Iterable[str]] | None = None,
           path: str | None = None, parse: Callable[[str], Any] | None = None,
           metavar: str | None = None, required: bool | None = None) -> Any:
    """A dataclass field that is also a command-line option.

    flags: its names [--the-field-name]; choices: the allowed values, or a function returning
    them (a table defined further down the module); path: "file" or "dir" (a click.Path that
    refuses the other); parse: turns the text into the field's value (a ValueError if it
    cannot: see below); required: [when the field has no default]."""
    spec = {"help": help, "flags": flags, "choices": choices, "path": path, "parse": parse,
            "metavar": metavar, "required": required}
    return field(default=default, metadata={KEY: spec})


def cli_fields(cls: type) -> dict[str, Field[Any]]:
    """The fields of dataclass `cls` that are command-line options, by name, in order."""
    return {f.name: f for f in cls.__dataclass_fields__.values() if KEY in f.metadata}


# Parsers of an option's text (`parse=`): a ValueError's reason becomes the one-line error
# "--flag 'text': reason".

def parse_ids(text: str) -> list[int]:
    """--ids 1,2,3: token ids."""
    try:
        return [int(part) for part in text.replace(" ", "").split(",") if part]
    except ValueError:
        raise ValueError("expected comma-separated integers like 1,2,3") from None


def whole_number(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise ValueError("expected a whole number") from None


def card_override(pair: str) -> tuple[str, Any]:
    """--set FIELD=VALUE: a card field and its value, read as YAML."""
    name, sep, raw = pair.partition("=")
    if not sep or not name:
        raise ValueError("expected field=value")
    try:
        return name.strip(), yaml.safe_load(raw)
    except yaml.YAMLError as exc:
        problem = getattr(exc, "problem", None) or first_line(exc)
        raise ValueError(f"value is not valid YAML: {problem}") from exc
