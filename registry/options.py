"""Command-line options declared once, on the fields of the options dataclasses they fill:
`opset: int = option(18, "ONNX opset (18 to 25).")` is both the field and `zoo export --opset`
(its help, choices, default and flags); export/commands/options.py makes the click options.

Neither torch nor click is imported here, so any layer's options class may use it."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import MISSING, Field, field
from typing import Any

from registry.errors import ZooError

KEY = "zoo.option"  # the metadata key a field's command-line spec sits under


def option(default: Any = MISSING, help: str = "", *, flags: tuple[str, ...] = (),  # noqa: A002
           choices: Iterable[str] | Callable[[], Iterable[str]] | None = None,
           path: str | None = None, parse: Callable[[str], Any] | None = None,
           metavar: str | None = None, required: bool | None = None) -> Any:
    """A dataclass field that is also a command-line option.

    flags: its names [--the-field-name]; choices: the allowed values, or a function returning
    them (a table defined further down the module); path: "file" or "dir" (a click.Path that
    refuses the other); parse: turns the text into the field's value (a ZooError if it cannot);
    required: [when the field has no default]."""
    spec = {"help": help, "flags": flags, "choices": choices, "path": path, "parse": parse,
            "metavar": metavar, "required": required}
    return field(default=default, metadata={KEY: spec})


def cli_fields(cls: type) -> dict[str, Field[Any]]:
    """The fields of dataclass `cls` that are command-line options, by name, in order."""
    return {f.name: f for f in cls.__dataclass_fields__.values() if KEY in f.metadata}


def parse_ids(text: str) -> list[int]:
    """--ids 1,2,3: token ids."""
    try:
        return [int(part) for part in text.replace(" ", "").split(",") if part]
    except ValueError as exc:
        raise ZooError(f"--ids {text!r}: expected comma-separated integers like 1,2,3") from exc
