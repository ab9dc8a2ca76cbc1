"""One run at a time per output folder: a lock taken for the length of a command (training,
export, import, a Triton repository), so a second run into the same folder stops at once with
one line instead of interleaving its writes with the first (two `--resume` runs once logged
every step twice)."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path

from registry.errors import FaultError
from registry.paths import display_path

try:
    import fcntl
except ImportError:  # not POSIX: no advisory locks, runs are not serialised
    fcntl = None  # type: ignore[assignment]

_held: set[Path] = set()  # taken by this process: a nested write to the same folder may go on


def lock_path(target: Path) -> Path:
    """Beside the folder, not in it: the folder itself is replaced whole by atomic renames."""
    return target.parent / f".{target.name}.lock"


@contextlib.contextmanager
def output_lock(target: Path) -> Iterator[None]:
    target = Path(target).absolute()
    if fcntl is None or target in _held:
        yield
        return
    target.parent.mkdir(parents=True, exist_ok=True)
    path = lock_path(target)
    with _locked(path, target):
        _held.add(target)
        try:
            yield
        finally:
            _held.discard(target)
            path.unlink(missing_ok=True)  # still holding it, so no other run has it now


@contextlib.contextmanager
def _locked(path: Path, target: Path) -> Iterator[None]:
    while True:
        handle = path.open("a+b")
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            handle.close()
            raise FaultError(f"{display_path(target)}: another zoo run is writing it (lock "
                             f"{path.name} beside it); wait for that run to end") from None
        if _same_file(handle.fileno(), path):
            break
        handle.close()  # the holder removed this lock file as it let go: lock the new one
    try:
        yield
    finally:
        handle.close()


def _same_file(descriptor: int, path: Path) -> bool:
    try:
        return os.fstat(descriptor).st_ino == path.stat().st_ino
    except FileNotFoundError:
        return False
