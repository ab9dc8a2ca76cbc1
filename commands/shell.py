"""The click classes cli.py is made of: ZooGroup, which turns errors into one line and an exit
code, and OptionsCommand, whose options are made from the fields of an options dataclass
(registry/options.py declares them): `@fields("options", "export.options:ExportOptions")` gives
a command one option per field and hands it their values as one dict, `options`, to build the
object by keyword.

The dataclass's module is imported only when that command parses its arguments or shows its
help, so `zoo list` loads none of them (nor torch)."""

from __future__ import annotations

import importlib
import signal
import threading
from dataclasses import MISSING, Field
from pathlib import Path
from typing import Any

import click

from registry.errors import ZooError, first_line
from registry.options import KEY, cli_fields
from registry.paths import display_path

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
                                "multiple": multiple}
    if default is not None:  # click tells a missing value from one given as None
        settings["default"] = default
    settings["required"] = (spec["required"] if spec["required"] is not None
                            else spec_field.default is MISSING)
    if default is not None and default is not False and default != ():
        settings["show_default"] = True
    if kind is bool and not any("/" in flag for flag in flags):  # click reads --x/--no-x
        settings["is_flag"] = True
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
    """A value that a function makes from the text; its ValueError becomes the command's one
    line: "--flag 'text': reason", exit 2."""

    name = "text"

    def __init__(self, parse: Any) -> None:
        self.parse = parse

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None
                ) -> Any:
        if not isinstance(value, str):
            return value
        try:
            return self.parse(value)
        except ValueError as exc:
            flag = max(param.opts, key=len) if param is not None else "value"
            raise ZooError(f"{flag} {value!r}: {exc}") from None


EXIT_USER_ERROR = 2
EXIT_FAULT = 1


class ZooGroup(click.Group):
    """Turns a ZooError anywhere below into one line on stderr and exit code 2 (1 for a
    FaultError, and for an OSError: a full disk, a read-only location), after the report of a
    failed check; SIGTERM stops a command as Ctrl-C does, so its staged output is cleaned up
    on the way out. Its commands may take options from dataclasses (`@fields`)."""

    command_class = OptionsCommand

    def invoke(self, ctx: click.Context) -> Any:
        previous = _on_sigterm(_interrupt)
        try:
            return super().invoke(ctx)
        except ZooError as exc:
            report = getattr(exc, "report", None)  # a failed parity or agreement check
            if report is not None:
                click.echo(report.table())
            click.echo(f"error: {exc}", err=True)
            ctx.exit(getattr(exc, "exit_code", EXIT_USER_ERROR))
        except ModuleNotFoundError as exc:
            extra = missing_extra(exc)
            if extra is None:
                raise
            click.echo(f"error: {extra}", err=True)
            ctx.exit(EXIT_USER_ERROR)
        except OSError as exc:
            click.echo(f"error: {os_problem(exc)}", err=True)
            ctx.exit(EXIT_FAULT)
        finally:
            _on_sigterm(previous)


# What each optional install brings (pyproject.toml's extras): a runtime-only install runs
# exports; building, training and exporting need `export`, serving needs `serve`.
EXTRAS = {"torch": "export", "onnx": "export", "onnxscript": "export", "safetensors": "export",
          "matplotlib": "export", "starlette": "serve", "uvicorn": "serve"}


def missing_extra(exc: ModuleNotFoundError) -> str | None:
    """One line for a command whose optional dependencies are not installed, or None."""
    package = (exc.name or "").partition(".")[0]
    if package not in EXTRAS:
        return None
    extra = EXTRAS[package]
    return (f"this command needs {package}, which the zoo's `{extra}` extra installs: "
            f"pip install '.[{extra}]' in a checkout (or 'zoo[{extra}]' beside the wheel)")


def _on_sigterm(handler: Any) -> Any:
    """Install `handler` for SIGTERM, returning the one before; only the main thread may."""
    if threading.current_thread() is not threading.main_thread():
        return None
    return signal.signal(signal.SIGTERM, handler if handler is not None else signal.SIG_DFL)


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt  # unwinds through every atomic write's clean-up


def os_problem(exc: OSError) -> str:
    """One line for a failed read or write: the file where the OS names one, and why."""
    where = display_path(exc.filename) if exc.filename is not None else "writing the output"
    return f"{where}: {exc.strerror or first_line(exc)}"
