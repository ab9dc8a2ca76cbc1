"""atomic_folder: two runs into one new folder, failures, and --force."""

from __future__ import annotations

import contextlib
import os
import threading
from pathlib import Path

import pytest

from registry.errors import ZooError
from runtime.files.atomic import atomic_folder, atomic_write_bytes


def race(target: Path) -> tuple[list[str], list[str]]:
    """Two threads enter atomic_folder(target) and both try to claim it before either leaves.

    Returns (winners, error messages). The barrier sits after the entry attempt, so without an
    atomic claim both would enter, and the later rename would silently replace the earlier.
    """
    barrier = threading.Barrier(2, timeout=30)
    winners: list[str] = []
    errors: list[str] = []

    def attempt(tag: str) -> None:
        with contextlib.ExitStack() as stack:
            staging: Path | None = None
            try:
                staging = stack.enter_context(atomic_folder(target, force=False))
            except ZooError as exc:
                errors.append(str(exc))
            barrier.wait()
            if staging is not None:
                (staging / "writer.txt").write_text(tag, encoding="utf-8")
                winners.append(tag)

    threads = [threading.Thread(target=attempt, args=(tag,)) for tag in ("a", "b")]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    return winners, errors


def test_two_runs_into_one_new_folder_exactly_one_wins(tmp_path: Path) -> None:
    target = tmp_path / "out"
    winners, errors = race(target)
    assert len(winners) == 1, (winners, errors)
    # The loser is refused in one line either way: by the winner's lock while it writes, or by
    # the folder it left (which comes first depends on the machine's timing).
    assert len(errors) == 1 and ("already exists (use --force to overwrite)" in errors[0]
                                 or "another zoo run is writing it" in errors[0])
    assert "\n" not in errors[0]
    assert (target / "writer.txt").read_text(encoding="utf-8") == winners[0]
    assert [p.name for p in tmp_path.iterdir()] == ["out"]  # no staging folder left


def test_a_failure_inside_leaves_no_folder(tmp_path: Path) -> None:
    target = tmp_path / "out"
    with pytest.raises(RuntimeError), atomic_folder(target, force=False) as staging:
        (staging / "half.bin").write_bytes(b"x")
        raise RuntimeError("export failed")
    assert list(tmp_path.iterdir()) == []


def test_an_existing_folder_is_refused_and_kept(tmp_path: Path) -> None:
    target = tmp_path / "out"
    target.mkdir()
    (target / "keep.txt").write_text("mine", encoding="utf-8")
    with pytest.raises(ZooError, match="already exists"), atomic_folder(target, force=False):
        pytest.fail("entered the context of an existing folder")
    assert [p.name for p in tmp_path.iterdir()] == ["out"]
    assert [p.name for p in target.iterdir()] == ["keep.txt"]


def test_force_replaces_and_a_forced_failure_keeps_the_old_folder(tmp_path: Path) -> None:
    target = tmp_path / "out"
    target.mkdir()
    (target / "old.txt").write_text("old", encoding="utf-8")
    with pytest.raises(RuntimeError), atomic_folder(target, force=True) as staging:
        (staging / "new.txt").write_text("new", encoding="utf-8")
        raise RuntimeError("export failed")
    assert [p.name for p in target.iterdir()] == ["old.txt"]
    with atomic_folder(target, force=True) as staging:
        (staging / "new.txt").write_text("new", encoding="utf-8")
    assert [p.name for p in target.iterdir()] == ["new.txt"]
    assert [p.name for p in tmp_path.iterdir()] == ["out"]


def test_an_atomically_written_file_gets_the_usual_permissions(tmp_path: Path) -> None:
    """The temporary file is private (0600); the file it becomes follows the umask, as any
    file the user writes would (0644 under the usual 022)."""
    previous = os.umask(0o022)
    try:
        atomic_write_bytes(tmp_path / "out.png", b"data")
        with atomic_folder(tmp_path / "folder", force=False) as staging:
            (staging / "inside").write_bytes(b"data")
    finally:
        os.umask(previous)
    assert (tmp_path / "out.png").stat().st_mode & 0o777 == 0o644
    assert (tmp_path / "folder").stat().st_mode & 0o777 == 0o755
