"""Faults of the machine, not of the input: a read-only location, a full disk, SIGTERM, and a
second run into an output folder a first one is writing. Each is one line on stderr and exit 1,
and what was there before is left as it was (no half-written output, no staging left over)."""

from __future__ import annotations

import errno
import fcntl
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from registry.errors import ZooError
from runtime.files.lock import lock_path
from tests.support.folders import fake_export
from tests.support.helpers import assert_error_after_progress, assert_one_line_error, zoo

ROOT = Path(__file__).resolve().parents[2]


def everything(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() if p.is_file() else b"<dir>"
            for p in sorted(folder.rglob("*"))}


def read_only_below(monkeypatch: pytest.MonkeyPatch, root: Path) -> None:
    """mkdtemp and mkdir under `root` fail as on a read-only mount (root ignores chmod)."""
    real_mkdtemp, real_mkdir = tempfile.mkdtemp, os.mkdir

    def refuse(path: object) -> None:
        if Path(str(path)).absolute().is_relative_to(root):
            raise OSError(errno.EROFS, os.strerror(errno.EROFS), str(path))

    def mkdtemp(suffix=None, prefix=None, dir=None):  # noqa: ANN001, ANN202, A002
        refuse(dir or tempfile.gettempdir())
        return real_mkdtemp(suffix, prefix, dir)

    def mkdir(path, mode=0o777, *args, **kwargs):  # noqa: ANN001, ANN202
        refuse(path)
        return real_mkdir(path, mode, *args, **kwargs)

    monkeypatch.setattr(tempfile, "mkdtemp", mkdtemp)
    monkeypatch.setattr(os, "mkdir", mkdir)


@pytest.mark.parametrize("command", [
    ["build", "gpt-tiny", "-o", "{ro}/built"],
    ["triton", "{export}", "-o", "{ro}/repo"],
])
def test_a_read_only_output_location_is_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                 command: list[str]) -> None:
    export = fake_export(tmp_path / "exp", "data.bin")
    (export / "data.bin").write_bytes(b"\0" * 16)
    (tmp_path / "ro").mkdir()
    read_only_below(monkeypatch, tmp_path / "ro")
    args = [part.format(ro=tmp_path / "ro", export=export) for part in command]
    assert_error_after_progress(zoo(*args), "Read-only file system", code=1)
    assert list((tmp_path / "ro").iterdir()) == []


def test_export_with_triton_into_a_read_only_repository_lands_nothing(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "ro").mkdir()
    read_only_below(monkeypatch, tmp_path / "ro")
    result = zoo("export", "gpt-tiny", "--onnx", "-o", str(tmp_path / "onnx"),
                 "--triton", str(tmp_path / "ro" / "repo"))
    assert_error_after_progress(result, "Read-only file system", code=1)
    assert not (tmp_path / "onnx").exists()  # refused before the export, not after it landed


def test_a_full_disk_during_export_force_keeps_the_old_export(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    old = tmp_path / "onnx"
    old.mkdir()
    (old / "model.onnx").write_bytes(b"the old export")

    def full(*args: object, **kwargs: object) -> bytes:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr("export.onnx.writer.write_weights", full)
    result = zoo("export", "gpt-tiny", "--onnx", "-o", str(old), "--force")
    assert_error_after_progress(result, "No space left on device", code=1)
    assert everything(tmp_path) == {"onnx": b"<dir>", "onnx/model.onnx": b"the old export"}


def test_a_full_disk_at_a_checkpoint_keeps_the_previous_one(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from safetensors.torch import save

    calls = []

    def save_then_fill(*args: object, **kwargs: object) -> bytes:
        calls.append(1)
        if len(calls) > 1:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return save(*args, **kwargs)

    monkeypatch.setattr("zoo.training.checkpoints.save", save_then_fill)
    out = tmp_path / "trained"
    result = zoo("train", "gpt-tiny", "--task", "lm", "--steps", "2", "--checkpoint-every", "1",
                 "--batch-size", "2", "--block-size", "16", "-o", str(out))
    assert_error_after_progress(result, "No space left on device", code=1)
    checkpoints = out / "checkpoints"
    assert (checkpoints / "latest").read_text().strip() == "step-00000001"
    assert sorted(p.name for p in checkpoints.iterdir()) == ["latest", "step-00000001"]


TRAIN = ("train", "gpt-tiny", "--task", "lm", "--batch-size", "2", "--block-size", "16")


def fail_first_step(monkeypatch: pytest.MonkeyPatch, fault: BaseException) -> None:
    def loss(*args: object) -> None:
        raise fault

    monkeypatch.setattr("zoo.training.tasks.TrainingTask.loss", loss)


@pytest.mark.parametrize("fault", [ZooError("a bad row found late"), RuntimeError("a bug")],
                         ids=["one-line", "fault"])
def test_a_train_failing_before_a_checkpoint_leaves_no_out(
        fault: BaseException, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fail_first_step(monkeypatch, fault)
    result = zoo(*TRAIN, "--steps", "1", "-o", tmp_path / "new" / "trained")
    assert result.exit_code != 0 and str(fault) in str(result.exception) + result.output
    assert everything(tmp_path) == {"new": b"<dir>"}  # config.yaml and the rest went with OUT


def test_a_resume_failing_at_its_first_step_keeps_the_folder(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    out = tmp_path / "trained"
    assert zoo(*TRAIN, "--steps", "1", "-o", out).exit_code == 0
    kept = everything(tmp_path)
    fail_first_step(monkeypatch, ZooError("a bad row found late"))
    result = zoo(*TRAIN[:1], out, *TRAIN[2:], "--steps", "2", "--resume", "-o", out)
    assert_one_line_error(result, "a bad row found late")
    assert everything(tmp_path) == kept


def hold_lock(folder: Path) -> object:
    """The lock a running zoo command holds, taken as another process would hold it."""
    folder.parent.mkdir(parents=True, exist_ok=True)
    handle = lock_path(folder.absolute()).open("a+b")
    fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    return handle


@pytest.mark.parametrize("command", [
    ["train", "gpt-tiny", "--task", "lm", "--steps", "1", "-o", "{out}"],
    ["export", "gpt-tiny", "--onnx", "-o", "{out}"],
    ["triton", "{export}", "-o", "{out}"],
])
def test_a_second_run_into_a_folder_being_written_stops_at_once(tmp_path: Path,
                                                                 command: list[str]) -> None:
    export = fake_export(tmp_path / "exp", "data.bin")
    (export / "data.bin").write_bytes(b"\0" * 16)
    out = tmp_path / "out"
    handle = hold_lock(out)
    try:
        args = [part.format(out=out, export=export) for part in command]
        assert_error_after_progress(zoo(*args), "another zoo run is writing it", code=1)
    finally:
        handle.close()
    assert not out.exists()


def test_a_second_resume_of_one_training_run_stops_at_once(tmp_path: Path) -> None:
    """Two `zoo train --resume` on one folder once both ran and logged every step twice."""
    out = tmp_path / "trained"
    first = zoo("train", "gpt-tiny", "--task", "lm", "--steps", "2", "--checkpoint-every", "2",
                "--batch-size", "2", "--block-size", "16", "-o", str(out))
    assert first.exit_code == 0, first.output
    before = everything(out)
    handle = hold_lock(out)
    try:
        assert_error_after_progress(zoo("train", str(out), "--task", "lm", "--steps", "4",
                                        "--resume", "-o", str(out)),
                                    "another zoo run is writing it", code=1)
    finally:
        handle.close()
    assert everything(out) == before


def test_the_lock_is_let_go_after_a_run(tmp_path: Path) -> None:
    out = tmp_path / "built"
    assert zoo("build", "gpt-tiny", "-o", str(out)).exit_code == 0
    assert not lock_path(out.absolute()).exists()
    hold_lock(out).close()  # free again


def test_sigterm_during_train_force_cleans_its_staging(tmp_path: Path) -> None:
    out = tmp_path / "trained"
    out.mkdir()
    (out / "config.yaml").write_text("the old run\n")
    process = subprocess.Popen(
        [sys.executable, "-c", "import cli; cli.main()", "train", "gpt-tiny", "--task", "lm",
         "--steps", "100000", "--batch-size", "2", "--block-size", "16", "-o", str(out),
         "--force"], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env={**os.environ, "OMP_NUM_THREADS": "1"})
    deadline = time.monotonic() + 120
    staged = []
    while time.monotonic() < deadline and process.poll() is None:
        staged = [p for p in tmp_path.iterdir() if p.name.startswith(".trained.")
                  and p.is_dir() and (p / "config.yaml").exists()]
        if staged:
            break
        time.sleep(0.2)
    assert staged, "training never started: " + (process.stderr.read() if process.stderr else "")
    process.send_signal(signal.SIGTERM)
    _, stderr = process.communicate(timeout=60)
    assert process.returncode != 0
    assert "Traceback" not in stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["trained"]  # no staging left
    assert everything(out) == {"config.yaml": b"the old run\n"}
