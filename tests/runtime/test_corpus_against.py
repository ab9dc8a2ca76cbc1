"""`zoo classify --against REFERENCE --label-column COLUMN` and `zoo embed --against`: two
exports over the same rows, side by side. The expected figures are computed here with numpy
from each export's own output files (each written by a plain run, without --against)."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import numpy as np
import pytest

from registry.paths import display_path
from runtime.files.tokenizer import BYTE_TOKENIZER, ByteTokenizer
from tests.conftest import BERT_CLASSIFIER, CLASSIFIER_SEED, ON_CLASSIFIER, export_card
from tests.support.helpers import assert_one_line_error, zoo

pytestmark = ON_CLASSIFIER

TEXTS = ["ROMEO: what light", "a", "Is this a dagger which I see before me", "to be",
         "O, été", "Friends, Romans, countrymen", "xy", "lend me your ears; I come",
         "the quality of mercy", "is not strained", "now is the winter", "of our discontent"]
LABELS = ["low", "mid", "high"]


def with_bytes(export: Path, copy: Path) -> Path:
    """A copy of an export with the byte tokenizer its card's vocabulary is."""
    shutil.copytree(export, copy)
    (copy / BYTE_TOKENIZER).write_text(ByteTokenizer().to_json())
    return copy


@pytest.fixture(scope="module")
def exports(classifier_export: Path, tmp_path_factory: pytest.TempPathFactory
            ) -> tuple[Path, Path]:
    """(reference, candidate): the shared classifier and the same card with other weights,
    so that some rows' labels differ."""
    root = tmp_path_factory.mktemp("against")
    other = export_card(root / "seed", "bert-tiny", BERT_CLASSIFIER, CLASSIFIER_SEED + 1)
    return with_bytes(classifier_export, root / "reference"), with_bytes(other, root / "other")


def labelled(path: Path) -> Path:
    path.write_text("".join(json.dumps({"text": text, "label": LABELS[i % 3], "n": i}) + "\n"
                            for i, text in enumerate(TEXTS)), encoding="utf-8")
    return path


def probabilities(path: Path) -> np.ndarray:
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    return np.array([[row["probabilities"][name] for name in LABELS] for row in rows])


def test_classify_against_a_reference_prints_both_exports_side_by_side(
        exports: tuple[Path, Path], tmp_path: Path) -> None:
    reference, candidate = exports
    data = labelled(tmp_path / "rows.jsonl")
    for name, folder in (("ref", reference), ("cand", candidate)):
        assert zoo("classify", folder, "--data", data, "-o", tmp_path / f"{name}.jsonl"
                   ).exit_code == 0
        assert zoo("embed", folder, "--data", data, "-o", tmp_path / f"{name}.npy"
                   ).exit_code == 0
    p, q = probabilities(tmp_path / "ref.jsonl"), probabilities(tmp_path / "cand.jsonl")
    truth = np.array([i % 3 for i in range(len(TEXTS))])
    same = int((p.argmax(1) == q.argmax(1)).sum())
    assert 0 < same < len(TEXTS)  # the two exports differ on some rows, not all
    e, a = np.load(tmp_path / "ref.npy"), np.load(tmp_path / "cand.npy")
    cos = (e * a).sum(1) / (np.linalg.norm(e, axis=1) * np.linalg.norm(a, axis=1))

    out = tmp_path / "side.jsonl"
    result = zoo("classify", candidate, "--data", data, "-o", out, "--against", reference,
                 "--label-column", "label")
    assert result.exit_code == 0, result.output
    np.testing.assert_allclose(probabilities(out), q, atol=1e-6)  # the candidate's labels
    header, *table = result.stdout.splitlines()[1:4]
    assert header.split() == ["export", "rows/s", "accuracy"]
    for line, folder, found in zip(table, (reference, candidate), (p, q), strict=True):
        right = int((found.argmax(1) == truth).sum())
        name, *rest = line.split()
        assert name == display_path(folder) and float(rest[-3]) > 0  # rows/s
        assert line.endswith(f"{right / len(TEXTS):.3f} ({right}/{len(TEXTS)})")
    assert "(reference)" in table[0]
    versus = result.stdout.splitlines()[-1]
    assert f"the same label on {same} of {len(TEXTS)}" in versus
    change = float(re.search(r"max probability change ([\d.]+)", versus).group(1))
    assert change == pytest.approx(np.abs(p - q).max(), abs=2e-5)
    low = float(re.search(r"cosine min (-?[\d.]+)", versus).group(1))
    assert low == pytest.approx(cos.min(), abs=2e-5)

    vectors = tmp_path / "side.npy"
    embedded = zoo("embed", candidate, "--data", data, "-o", vectors, "--against", reference)
    assert embedded.exit_code == 0, embedded.output
    np.testing.assert_allclose(np.load(vectors), a, atol=1e-6)
    assert f"cosine min {cos.min():.5f}, mean {cos.mean():.5f}" in embedded.stdout


@pytest.mark.parametrize("rows, column, parts", [
    ('{"text": "a", "label": "low"}\n{"text": "b", "label": "top"}\n', "label",
     ("rows.jsonl:2:", "label 'top' is not one of the classes")),
    ('{"text": "a", "label": "low"}\n{"text": "b"}\n', "label",
     ("rows.jsonl:2:", "an object with 'label'")),
    ('{"text": "a", "label": "low"}\n{"text": "b", "label": null}\n', "label",
     ("rows.jsonl:2:", "expected a 'label'")),
])
def test_a_bad_label_is_one_error_at_its_line_before_any_output(
        exports: tuple[Path, Path], tmp_path: Path, rows: str, column: str,
        parts: tuple[str, ...]) -> None:
    reference, candidate = exports
    data = tmp_path / "rows.jsonl"
    data.write_text(rows, encoding="utf-8")
    out = tmp_path / "out" / "labels.jsonl"
    out.parent.mkdir()
    assert_one_line_error(zoo("classify", candidate, "--data", data, "-o", out,
                              "--against", reference, "--label-column", column), *parts)
    assert list(out.parent.iterdir()) == []


def test_labels_need_columns_and_a_reference_needs_the_same_classes(
        exports: tuple[Path, Path], tmp_path: Path) -> None:
    reference, candidate = exports
    lines = tmp_path / "rows.txt"
    lines.write_text("to be\nor not\n", encoding="utf-8")
    out = tmp_path / "l.jsonl"
    assert_one_line_error(zoo("classify", candidate, "--data", lines, "-o", out,
                              "--label-column", "label"), "rows.txt", ".jsonl or .csv")
    renamed = export_card(tmp_path, "bert-tiny", {**BERT_CLASSIFIER, "labels": ["a", "b", "c"]},
                          CLASSIFIER_SEED)
    assert_one_line_error(zoo("classify", with_bytes(renamed, tmp_path / "renamed"),
                              "--data", lines, "-o", out, "--against", reference),
                          "its classes", "['low', 'mid', 'high']", "['a', 'b', 'c']")
    assert not out.exists()


def test_a_reference_of_another_width_is_refused_before_either_runs_the_rows(
        exports: tuple[Path, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import commands.corpus

    def ran(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202
        raise AssertionError("rows run before the exports were compared")

    _, candidate = exports
    narrow = export_card(tmp_path, "bert-tiny", {**BERT_CLASSIFIER, "d_model": 32},
                         CLASSIFIER_SEED)
    narrow = with_bytes(narrow, tmp_path / "narrow")
    monkeypatch.setattr(commands.corpus, "run_corpus", ran)
    lines = tmp_path / "rows.txt"
    lines.write_text("to be\nor not\n", encoding="utf-8")
    out = tmp_path / "v.npy"
    assert_one_line_error(zoo("embed", candidate, "--data", lines, "-o", out, "--against", narrow),
                          "narrow", "sentence vectors have 32 values", "64")
    assert not out.exists()
