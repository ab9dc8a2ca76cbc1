"""`zoo --version`: one line, the installed distribution's version, which is the one
pyproject.toml declares (the Makefile reinstalls whenever pyproject.toml changes)."""

from __future__ import annotations

import importlib.metadata
import re
from pathlib import Path

from click.testing import CliRunner

import cli

ROOT = Path(__file__).resolve().parents[2]


def test_version_prints_the_distributions_version() -> None:
    declared = re.search(r'^version = "([^"]+)"$', (ROOT / "pyproject.toml").read_text(),
                         re.MULTILINE)
    assert declared is not None
    assert importlib.metadata.version("zoo") == declared.group(1)
    result = CliRunner().invoke(cli.main, ["--version"])
    assert result.exit_code == 0, result.output
    assert result.output == f"zoo {declared.group(1)}\n"
