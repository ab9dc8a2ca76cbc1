"""The CLI as tests call it, and how they check a refusal: `zoo(...)` runs a command in this
process; `assert_one_line_error` and `assert_error_after_progress` check that a command was
refused as a user should see it (an exit code, one `error:` line naming what is wrong, no
traceback). Both checks take click's Result or a finished subprocess."""

from __future__ import annotations

import subprocess
from pathlib import Path

from click.testing import CliRunner, Result

Finished = Result | subprocess.CompletedProcess


def zoo(*args: str | Path) -> Result:
    """`zoo ARGS` in this process; stdout and stderr apart, an exception kept on the result."""
    import cli  # here, not above: tests of a fresh interpreter import only the checks

    return CliRunner().invoke(cli.main, [str(arg) for arg in args])


def zoo_ok(*args: str | Path) -> str:
    """`zoo ARGS` in this process, which must succeed: its output."""
    result = zoo(*args)
    assert result.exit_code == 0, result.output
    return result.output


def imported_folders(sources: dict[str, tuple[Path, object]], root: Path) -> dict[str, Path]:
    """`zoo import` of each source folder ({name: (folder, reference model)}) into root/name."""
    for name, (folder, _) in sources.items():
        zoo_ok("import", folder, "-o", root / name)
    return {name: root / name for name in sources}


def refusal(result: Finished, code: int, parts: tuple[str, ...]) -> tuple[str, list[str]]:
    """(stdout, stderr lines) of a command refused with exit `code`, whose last stderr line is
    its only `error:` line and holds every part; no traceback, no exception but click's exit."""
    if isinstance(result, Result):
        exit_code, stdout, stderr = result.exit_code, result.stdout, result.stderr
        assert result.exception is None or isinstance(result.exception, SystemExit), \
            result.exception
    else:
        exit_code, stdout, stderr = result.returncode, result.stdout, result.stderr
    assert exit_code == code, stdout + stderr
    assert "Traceback" not in stdout + stderr
    lines = stderr.splitlines()
    errors = [line for line in lines if line.startswith("error: ")]
    assert errors and errors == lines[-1:], stderr
    for part in parts:
        assert part in errors[0], f"{part!r} not in {errors[0]!r}"
    return stdout, lines


def assert_one_line_error(result: Finished, *parts: str, code: int = 2) -> str:
    """Refused in exactly one line, `error: ...` on stderr holding every part, nothing on
    stdout; returns that line."""
    stdout, lines = refusal(result, code, parts)
    assert stdout == "", stdout
    assert len(lines) == 1, lines
    return lines[0]


def assert_error_after_progress(result: Finished, *parts: str, code: int = 2) -> str:
    """As assert_one_line_error, for a command that reports before it is refused (export's
    parity table on stdout, progress on stderr): the last stderr line is the only `error:`
    one; returns it."""
    return refusal(result, code, parts)[1][-1]


def assert_refused_and_nothing_written(args: list[str], out: Path, message: str) -> None:
    """`zoo ARGS -o OUT` is refused after its progress (assert_error_after_progress), and
    leaves neither OUT nor a staging folder beside it."""
    assert_error_after_progress(zoo(*args, "-o", out), message)
    assert not out.exists()
    assert list(out.parent.iterdir()) == []  # no staging folder left either
