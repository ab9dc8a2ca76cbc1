"""examples/optimum's own environment (Optimum and sentence-transformers apart from .venv), and why
a test skips without it."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
RUNNER = ROOT / "examples" / "optimum" / "run.py"
PYTHON = ROOT / "examples" / "optimum" / ".venv" / "bin" / "python"


def require_optimum() -> None:
    stamp, requirements = PYTHON.parents[1] / ".installed", RUNNER.with_name("requirements.txt")
    if not PYTHON.is_file() or not stamp.is_file():
        problem = f"{PYTHON} missing: run `bash examples/optimum/setup.sh`"
    elif stamp.stat().st_mtime < requirements.stat().st_mtime:
        # a venv made before requirements.txt changed lacks what the clients now need
        problem = f"{PYTHON.parents[1]} older than {requirements}: rerun its setup.sh"
    else:
        return
    if os.environ.get("ZOO_REQUIRE_OPTIMUM") == "1":
        pytest.fail(f"{problem} (ZOO_REQUIRE_OPTIMUM=1: these tests must run here)")
    pytest.skip(problem)
