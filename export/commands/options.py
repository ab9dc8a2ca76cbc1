"""Click options made from the fields of an options dataclass (registry/options.py declares
them): `@fields("options", "export.options:ExportOptions")` gives a command one option per
field and hands it their values as one dict, `options`, to build the object by keyword.

The dataclass's module is imported only when that command parses its arguments or shows its
help, so `zoo list` loads none of them (nor torch)."""

from __future__ import annotations

import importlib
from dataclasses import MISSING, Field
from pathlib import Path
from typing import Any

import click

from registry.options import KEY, cli_fields

TYPES = {"int": int, "float": float, "str": str, "bool": bool, "Path": Path}


class Fields:
    """Stands among a command's parameters where `names` of dataclass `target` ("module:Class")
    go, until the command first needs its parameters."""

    def __init__(self, key: str, target: str, names: str | None, helps: dict[str, str]) -> None:
        self.key, self.target, self.names, self.helps = key, target, names, helps

    def options(self) -> list[click.Option]:
        module, _, name = self.target.partition(":")
        declared = cli_fields(getattr(importlib.import_module(module), name))
        wanted = self.names.split() if self.names is not None else list(declared)
        return [click_option(declared[name], self.helps.get(name)) for name in wanted]


def fields(key: str, target: str, names: str | None = None, **helps: str) -> Any:
    """Decorator: the options of `target`'s fields (`names`, space-separated, in that order;
    default all, in field order), passed to the command as the dict `key`; `helps` replaces
    a field's help where this command uses it differently."""
    def decorate(function: Any) -> Any:
        params = function.__dict__.setdefault("__click_params__", [])
        params.append(Fields(key, target, names, helps))
        return function
    return decorate


class OptionsCommand(click.Command):
    """A click command whose Fields become options on first use; before it runs, their values
    are gathered into one dict per key."""

    keys: dict[str, str]  # an option's name -> the dict it goes into

    @property  # type: ignore[override]
    def params(self) -> list[click.Parameter]:
        if any(isinstance(param, Fields) for param in self._params):
            made: list[click.Parameter] = []
            for param in self._params:
                options = param.options() if isinstance(param, Fields) else [param]
                self.keys.update({option.name: param.key for option in options
                                  if isinstance(param, Fields) and option.name})
                made += options
            self._params = made
        return self._params

    @params.setter
    def params(self, value: list[click.Parameter]) -> None:
        self._params, self.keys = value, {}

    def invoke(self, ctx: click.Context) -> Any:
        for name, key in self.keys.items():
            ctx.params.setdefault(key, {})[name] = ctx.params.pop(name)
        return super().invoke(ctx)


def click_option(spec_field: Field[Any], help: str | None = None) -> click.Option:  # noqa: A002
    """The click option of one declared field (`help` in place of its own)."""
    spec = spec_field.metadata[KEY]
    annotation = str(getattr(spec_field.type, "__name__", spec_field.type))
    annotation = annotation.removesuffix(" | None")
    multiple = annotation.startswith("tuple[") and annotation.endswith(", ...]")
    kind = TYPES.get(annotation[6:-6] if multiple else annotation)
    default = None if spec_field.default is MISSING else spec_field.default
    flags = spec["flags"] or (f"--{spec_field.name.replace('_', '-')}",)
    settings: dict[str, Any] = {"help": help or spec["help"] or None, "metavar": spec["metavar"],
                                "multiple": multiple, "default": default}
    settings["required"] = (spec["required"] if spec["required"] is not None
                            else spec_field.default is MISSING)
    if default is not None and default is not False and default != ():
        settings["show_default"] = True
    if kind is bool and not any("/" in flag for flag in flags):
        settings["is_flag"] = True  # --flag/--no-flag: click sees it is one
    if spec["choices"] is not None:
        choices = spec["choices"]() if callable(spec["choices"]) else spec["choices"]
        settings["type"] = click.Choice(list(choices))
    elif spec["parse"] is not None:
        settings["type"] = Parsed(spec["parse"])
    elif kind is Path:
        settings["type"] = click.Path(path_type=Path, dir_okay=spec["path"] != "file",
                                      file_okay=spec["path"] != "dir")
    elif kind is not bool:
        settings["type"] = kind
    return click.Option([spec_field.name, *flags], **settings)


class Parsed(click.ParamType):
    """A value that a function makes from the text; its ZooError is the command's one line."""

    name = "text"

    def __init__(self, parse: Any) -> None:
        self.parse = parse

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None
                ) -> Any:
        return self.parse(value) if isinstance(value, str) else value
