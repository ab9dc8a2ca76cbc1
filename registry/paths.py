"""How a file is named in messages: relative to the working folder when under it."""

from __future__ import annotations

import os
from pathlib import Path


def display_path(path: str | os.PathLike[str]) -> str:
    resolved = Path(path).resolve()
    try:
        return str(resolved.relative_to(Path.cwd()))
    except ValueError:
        return str(resolved)
