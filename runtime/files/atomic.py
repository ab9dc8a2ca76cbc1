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
from runtime.files.lock import output_lock


def already_exists(path: Path) -> ZooError:
    return ZooError(f"{display_path(path)} already exists (use --force to overwrite)")


def refuse_existing(path: Path, force: bool) -> None:
    if path.exists() and not force:
        raise already_exists(path)


def check_writable(target: Path) -> None:
    """Raise the OSError a write beside `target` would (read-only, no permission), before
    minutes of work that would then be lost."""
    target.parent.mkdir(parents=True, exist_ok=True)
    Path(tempfile.mkdtemp(prefix=f".{target.name}.probe.", dir=target.parent)).rmdir()


def claim(target: Path) -> None:
    """Create `target` empty: mkdir is atomic, so of two racing runs exactly one succeeds."""
    try:
        os.mkdir(target)
    except FileExistsError:
        raise already_exists(target) from None


@contextlib.contextmanager
def atomic_folder(target: Path, force: bool) -> Iterator[Path]:
    """Yield an empty temporary folder; on success it replaces `target` in one rename.

    Without `force`, `target` is claimed first by creating it empty, so a second run into the
    same new folder fails at once with "already exists" instead of silently replacing the
    first; the staged folder is then renamed onto the empty claim. On any error the temporary
    folder (and the claim) is removed and `target` is left exactly as it was.
    """
    target = Path(target)
    refuse_existing(target, force)  # the common case, before anything is created
    target.parent.mkdir(parents=True, exist_ok=True)
    with output_lock(target):
        staging = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))
        claimed = False
        try:
            if not force:
                claim(target)
                claimed = True
            yield staging
            os.chmod(staging, 0o777 & ~current_umask())  # mkdtemp: 0700, for the staging name
            if force and target.exists():
                old = Path(tempfile.mkdtemp(prefix=f".{target.name}.old.", dir=target.parent))
                os.replace(target, old / target.name)
                os.replace(staging, target)
                shutil.rmtree(old, ignore_errors=True)
            else:
                os.replace(staging, target)  # POSIX: a folder may replace an empty folder
        except BaseException:
            shutil.rmtree(staging, ignore_errors=True)
            if claimed:
                with contextlib.suppress(OSError):
                    target.rmdir()  # only while still the empty claim: never staged contents
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
    temporary = _staged(target, data)
    try:
        os.replace(temporary, target)
    except BaseException:
        temporary.unlink(missing_ok=True)
        raise


def write_file(target: Path, data: bytes, force: bool) -> None:
    """A command's output file, written atomically under the lock beside it. Without `force`
    it never replaces a file, not even one made since the command's first check (by another
    program, or a run that held no lock): the staged file is hard-linked to the name, which
    fails where the name exists."""
    target = Path(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    with output_lock(target):
        if force:
            atomic_write_bytes(target, data)
            return
        temporary = _staged(target, data)
        try:
            _link_new(temporary, target)
        finally:
            temporary.unlink(missing_ok=True)


@contextlib.contextmanager
def output_file(target: Path, force: bool) -> Iterator[None]:
    """For the length of a command that writes `target`: refused at once where it exists
    (without `force`) or cannot be written, and locked, so a second run into it stops with
    one line instead of replacing this one's file when both end. `write_file` writes it."""
    target = Path(target)
    refuse_existing(target, force)  # before minutes of work, not after
    check_writable(target)
    with output_lock(target):
        yield


def _link_new(temporary: Path, target: Path) -> None:
    try:
        os.link(temporary, target)
    except FileExistsError:
        raise already_exists(target) from None
    except OSError:  # no hard links here (some network and FAT file systems): claim the name
        try:
            os.close(os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666))
        except FileExistsError:
            raise already_exists(target) from None
        os.replace(temporary, target)  # onto the empty claim


def _staged(target: Path, data: bytes) -> Path:
    """`data` in a temporary file beside `target`, flushed to disk."""
    handle, temporary = tempfile.mkstemp(prefix=f".{target.name}.", dir=target.parent)
    try:
        os.chmod(temporary, 0o666 & ~current_umask())  # mkstemp: 0600, for the temporary name
        with os.fdopen(handle, "wb") as stream:
            stream.write(data)
            stream.flush()
            os.fsync(stream.fileno())
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise
    return Path(temporary)


def current_umask() -> int:
    current = os.umask(0)  # the only way to read it is to set it
    os.umask(current)
    return current


def wrote(folder: Path) -> str:
    """The line every command that made a folder ends with: the folder and its files."""
    return f"wrote {folder}/ ({', '.join(sorted(p.name for p in folder.iterdir()))})"
