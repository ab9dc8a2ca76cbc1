"""Options declared once, on dataclass fields (registry/options.py), and made into click
options by @fields (commands/shell.py): what a command receives, its help, its errors,
and that the dataclass's module is imported only by the command that uses it."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import click
import pytest
from click.testing import CliRunner

from commands.shell import OptionsCommand, ZooGroup, fields
from registry.options import option, parse_ids
from tests.conftest import modules_loaded

SHAPES = {"round": 1, "square": 2}  # a table defined after the class reads it


@dataclass(frozen=True)
class Toy:
    folder: Path  # not an option
    data: Path = option(help="Rows.", path="file")
    size: int = option(3, "How big.")
    scale: float | None = option(None, "A factor [1.0].")
    shape: str | None = option(None, "The outline.", choices=lambda: SHAPES)
    out: Path | None = option(None, "Where.", flags=("-o", "--out"), path="dir")
    ids: tuple[list[int], ...] = option((), "Token ids.", flags=("--ids",), parse=parse_ids)
    tags: tuple[str, ...] = option((), "Repeatable.", flags=("--tag",))
    loud: bool = option(False, "A flag.")
    fast: bool = option(True, "On unless --slow.", flags=("--fast/--slow",))
    secret: int = 7  # not an option either


received: dict[str, Any] = {}


@click.group(cls=ZooGroup)
def toys() -> None:
    """Test group."""


@toys.command()
@click.argument("folder")
@fields("options", "tests.registry.test_cli_options:Toy", "size scale shape data out ids")
@click.option("--name", default="x")
@fields("more", "tests.registry.test_cli_options:Toy", "tags loud fast", loud="Shout.")
def toy(folder: str, name: str, options: dict[str, Any], more: dict[str, Any]) -> None:
    """A toy command."""
    received.update(toy=Toy(Path(folder), **options, **more), name=name, more=more)


def invoke(*args: str) -> click.testing.Result:
    received.clear()
    return CliRunner().invoke(toys, list(args))


def test_values_reach_the_object_by_keyword(tmp_path: Path) -> None:
    data = tmp_path / "rows.txt"
    result = invoke("toy", "f", "--data", str(data), "--size", "5", "--scale", "0.5",
                    "--shape", "square", "-o", str(tmp_path), "--ids", "1, 2,3", "--ids", "4",
                    "--tag", "a", "--tag", "b", "--loud", "--slow", "--name", "n")
    assert result.exit_code == 0, result.output
    assert received["toy"] == Toy(Path("f"), data, 5, 0.5, "square", tmp_path, ([1, 2, 3], [4]),
                                  ("a", "b"), True, False)
    assert type(received["toy"].data) is type(data)  # a Path, not the text
    assert received["name"] == "n"
    assert set(received["more"]) == {"tags", "loud", "fast"}


def test_defaults_are_the_dataclass_defaults() -> None:
    result = invoke("toy", "f", "--data", "rows.txt")
    assert result.exit_code == 0, result.output
    assert received["toy"] == Toy(Path("f"), Path("rows.txt"), 3, None, None, None, (), (),
                                  False, True)


def test_help_shows_help_choices_defaults_in_declared_order() -> None:
    result = invoke("toy", "--help")
    assert result.exit_code == 0, result.output
    text = " ".join(result.output.split())
    assert "--size INTEGER How big. [default: 3]" in text
    assert "--scale FLOAT A factor [1.0]." in text  # no [default: None]
    assert "--shape [round|square] The outline." in text
    assert "--data FILE Rows. [required]" in text
    assert "-o, --out DIRECTORY Where." in text
    assert "--loud Shout." in text  # this command's help in place of the field's
    assert "--fast / --slow On unless --slow. [default: fast]" in text
    assert "--secret" not in text and "--folder" not in text
    flags = ["--size", "--scale", "--shape", "--data", "--out", "--ids", "--name", "--tag",
             "--loud", "--fast"]
    places = [text.index(flag + " ") for flag in flags]
    assert places == sorted(places)


@pytest.mark.parametrize(("args", "message"), [
    (["--ids", "1,x"], "error: --ids '1,x': expected comma-separated integers like 1,2,3"),
    (["--shape", "oval"], "Invalid value for '--shape': 'oval' is not one of 'round', 'square'"),
    (["--size", "big"], "Invalid value for '--size': 'big' is not a valid integer"),
])
def test_bad_values_are_refused(tmp_path: Path, args: list[str], message: str) -> None:
    result = invoke("toy", "f", "--data", "rows.txt", *args)
    assert result.exit_code == 2
    assert message in result.output
    assert not received


def test_a_required_field_is_a_required_option() -> None:
    result = invoke("toy", "f")
    assert result.exit_code == 2
    assert "Missing option '--data'" in result.output


def test_a_folder_is_refused_where_a_file_is_asked(tmp_path: Path) -> None:
    result = invoke("toy", "f", "--data", str(tmp_path))
    assert result.exit_code == 2
    assert "is a directory" in result.output


def test_the_zoo_group_makes_options_commands() -> None:
    assert ZooGroup.command_class is OptionsCommand


def test_zoo_list_imports_no_options_module() -> None:
    """The options classes' modules load only when their command parses or shows help; the
    shell and its printing are torch-free commands/, so nothing of export/, zoo/ or torch."""
    assert modules_loaded([["list"], ["--help"]], ("export", "zoo", "torch")) == []
    assert {"commands.printing", "commands.shell"} <= set(
        modules_loaded([["list"]], ("commands",)))


def test_choices_are_the_librarys_tables() -> None:
    """--task, --quantize, --provider and --schedule list what the library defines."""
    from cli import main
    from export.onnx.quantize import CHOICES
    from runtime.sessions import PROVIDERS
    from zoo.training.schedules import SCHEDULES
    from zoo.training.tasks import TASKS

    def choices(command: click.Command, flag: str) -> list[str]:
        found = [p for p in command.params if isinstance(p, click.Option) and flag in p.opts]
        assert len(found) == 1, flag
        return list(found[0].type.choices)  # type: ignore[attr-defined]

    commands = main.commands
    assert choices(commands["train"], "--task") == list(TASKS)
    assert choices(commands["train"], "--schedule") == list(SCHEDULES)
    assert choices(commands["export"], "--quantize") == list(CHOICES)
    assert choices(commands["bench"], "--quantize") == list(CHOICES)
    for name in ("export", "run", "embed", "classify", "evaluate", "bench", "parity"):
        assert choices(commands[name], "--provider") == list(PROVIDERS), name
