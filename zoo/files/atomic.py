"""Atomic writes: everything is written under a temporary name beside the target, then renamed
into place, so an interrupted write never leaves a half file (or folder) under the real name."""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

from registry.errors import ZooError
from registry.paths import display_path


def refuse_existing(path: Path, force: bool) -> None:
    if path.exists() and not force:
        raise ZooError(f"{display_path(path)} already exists (use --force to overwrite)")


@contextlib.contextmanager
def atomic_folder(target: Path, force: bool) -> Iterator[Path]:
    """Yield an empty temporary folder; on success it replaces `target` in one rename.

    On any error the temporary folder is removed and `target` is left exactly as it was.
    """
    target = Path(target)
    refuse_existing(target, force)
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))
    try:
        yield staging
        if target.exists():
            old = Path(tempfile.mkdtemp(prefix=f".{target.name}.old.", dir=target.parent))
            os.replace(target, old / target.name)
            os.replace(staging, target)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(staging, target)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise


def sha256(path: Path) -> str:
    """Hex digest of a file, read in 1 MiB blocks (files may be gigabytes)."""
    digest = hashlib.sha256()
    with Path(path).open("rb") as stream:
        for block in iter(lambda: stream.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def atomic_write_bytes(target: Path, data: bytes) -> None:
    """Write one file atomically (used for files inside an existing folder)."""
    target = Path(target)
    handle, temporary = tempfile.mkstemp(prefix=f".{target.name}.", dir=target.parent)
    try:
        with os.fdopen(handle, "wb") as stream:
            stream.write(data)
            stream.flush()
            os.fsync(stream.fileno())
        os.replace(temporary, target)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise
