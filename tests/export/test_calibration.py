"""`zoo export --quantize int8-dynamic --calibration FILE`: the smoothing measures its
activations on the user's texts (rows spread over the whole file, cut to a bounded length)
instead of the shipped English text; the manifest says which; a file it cannot use, or the
option where nothing calibrates, is one line before any export work."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

import export.onnx.dynamic
import export.onnx.writer
from cli import main
from export.checks.quality import CALIBRATION_LONGEST, CALIBRATION_ROWS, calibration_batch
from registry.paths import display_path
from runtime.contract import MANIFEST
from runtime.files.texts import TextRow
from runtime.files.tokenizer import BYTE_TOKENIZER, ByteTokenizer
from tests.conftest import card, traces_reused
from tests.support.helpers import assert_refused_and_nothing_written

ROWS = 80  # more than calibration takes, so that which rows it picks is seen


def texts() -> list[str]:
    """Code, not English: what a user would calibrate a code model on."""
    return [f"def f{i}(x): return x * {i} + {'y' * (i % 7)}" for i in range(ROWS)]


def decoded(feeds: dict[str, np.ndarray]) -> list[str]:
    """Each calibration row's real tokens, as the byte tokenizer's bytes."""
    mask = feeds["attention_mask"].astype(bool)
    return [bytes(row[keep].tolist()).decode() for row, keep in zip(feeds["input_ids"], mask,
                                                                      strict=True)]


def test_calibration_rows_are_the_files_rows_spread_over_it_and_cut() -> None:
    rows = [TextRow(text, line) for line, text in enumerate(texts(), start=1)]
    rows[-1] = TextRow("z" * 300, ROWS)  # past CALIBRATION_LONGEST
    feeds = calibration_batch(card("bert-tiny"), ByteTokenizer(), rows, "rows.txt")
    got = decoded(feeds)
    assert len(got) == CALIBRATION_ROWS
    assert got[0] == texts()[0] and got[-1] == "z" * CALIBRATION_LONGEST  # first and last row
    assert set(got[1:-1]) <= set(texts()) and len(set(got)) == CALIBRATION_ROWS  # no repeats


def test_too_few_rows_or_no_tokenizer_is_one_line() -> None:
    rows = [TextRow(text, line) for line, text in enumerate(texts()[:3], start=1)]
    with pytest.raises(Exception, match=r"rows\.txt: 3 rows; calibration needs at least 8"):
        calibration_batch(card("bert-tiny"), ByteTokenizer(), rows, "rows.txt")
    rows = [TextRow(text, line) for line, text in enumerate(texts(), start=1)]
    with pytest.raises(Exception, match=r"rows\.txt: --calibration needs the export's tokenizer"):
        calibration_batch(card("bert-tiny"), None, rows, "rows.txt")


@pytest.fixture(scope="module")
def embedder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """bert-tiny as an embedder, built with the byte tokenizer its vocabulary is for."""
    folder = tmp_path_factory.mktemp("calibration") / "bert-tiny"
    result = CliRunner().invoke(main, ["build", "bert-tiny", "--set", 'pooling="mean"',
                                       "--seed", "3", "-o", str(folder)])
    assert result.exit_code == 0, result.output
    (folder / BYTE_TOKENIZER).write_text(ByteTokenizer().to_json(), encoding="utf-8")
    return folder


def test_an_int8_dynamic_export_calibrates_on_the_file_given(
        embedder: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        shared_traces: dict) -> None:
    data = tmp_path / "code.txt"
    data.write_text("".join(text + "\n" for text in texts()), encoding="utf-8")
    seen: list[dict[str, np.ndarray]] = []
    smoothing = export.onnx.dynamic.prepare_for_int8

    def recorded(model, calibration, *args, **kwargs):  # noqa: ANN001, ANN002, ANN003, ANN202
        seen.append(calibration)
        return smoothing(model, calibration, *args, **kwargs)

    monkeypatch.setattr(export.onnx.dynamic, "prepare_for_int8", recorded)
    out = tmp_path / "out"
    with traces_reused(shared_traces):
        result = CliRunner().invoke(main, ["export", str(embedder), "--onnx", "--quantize",
                                           "int8-dynamic", "--calibration", str(data),
                                           "-o", str(out)])
    assert result.exit_code == 0, result.output
    assert seen and set(decoded(seen[0])) <= set(texts())  # the file's rows, no shipped text
    assert len(decoded(seen[0])) == CALIBRATION_ROWS
    manifest = json.loads((out / MANIFEST).read_text())
    calibration = manifest["quantization"]["rewrites"]["calibration"]
    assert calibration == f"{CALIBRATION_ROWS} rows of {display_path(data)}"


@pytest.mark.parametrize(("case", "message"), [
    ("int8", "--calibration: only --quantize int8-dynamic calibrates"),
    ("missing", "no such data file"),
    ("empty", "data file is empty"),
    ("short", "3 rows; calibration needs at least 8"),
    ("no tokenizer", "--calibration needs the export's tokenizer"),  # the bert-tiny card's
])
def test_a_calibration_it_cannot_use_is_refused_before_any_work(
        case: str, message: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def traced(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202
        raise AssertionError("traced before refusing")

    monkeypatch.setattr(export.onnx.writer, "export_graph", traced)
    data = tmp_path / "data.txt"
    rows = {"empty": [""], "short": texts()[:3]}.get(case, texts())
    data.write_text("".join(text + "\n" for text in rows), encoding="utf-8")
    if case == "missing":
        data = tmp_path / "missing.txt"
    quantize = "int8" if case == "int8" else "int8-dynamic"
    (tmp_path / "out").mkdir()
    assert_refused_and_nothing_written(
        ["export", "bert-tiny", "--onnx", "--quantize", quantize, "--calibration", str(data)],
        tmp_path / "out" / "export", message)


def test_an_onnx_runtime_failure_in_calibration_is_one_line(
        embedder: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def failing(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202
        raise RuntimeError("[ONNXRuntimeError] : 6 : RUNTIME_EXCEPTION : probe failed\nmore")

    monkeypatch.setattr(export.onnx.dynamic, "prepare_for_int8", failing)
    (tmp_path / "out").mkdir()
    assert_refused_and_nothing_written(
        ["export", str(embedder), "--onnx", "--quantize", "int8-dynamic"],
        tmp_path / "out" / "export", "--quantize int8-dynamic: calibration: [ONNXRuntimeError]")
