"""Paths in messages (relative to the working folder when under it), and paths read from files
kept inside their folder."""

from __future__ import annotations

import os
from pathlib import Path

from registry.errors import ZooError


def display_path(path: str | os.PathLike[str]) -> str:
    resolved = Path(path).resolve()
    try:
        return str(resolved.relative_to(Path.cwd()))
    except ValueError:
        return str(resolved)


def inside(folder: str | os.PathLike[str], name: object, where: str, field: str) -> Path:
    """`folder / name` for a path read from a file (a manifest entry, an external-data location,
    a module path, a tokenizer file), refused in one line naming `where` and `field` when it is
    absolute, climbs out of `folder`, or resolves out of it through a symlink: a hostile folder
    must not make a command read or write anything beside it."""
    root = Path(folder)
    if not isinstance(name, str) or not name or "\0" in name:
        raise ZooError(f"{where}: {field} {name!r} should be a file name inside "
                       f"{display_path(root)}")
    if Path(name).is_absolute():
        raise ZooError(f"{where}: {field} {name!r} is an absolute path; it should name a file "
                       f"inside {display_path(root)}")
    if os.path.normpath(name).split(os.sep)[0] == os.pardir:
        raise ZooError(f"{where}: {field} {name!r} leaves the folder {display_path(root)}")
    path = root / name
    if not path.resolve().is_relative_to(root.resolve()):
        raise ZooError(f"{where}: {field} {name!r} is a symlink out of the folder "
                       f"{display_path(root)}")
    return path
