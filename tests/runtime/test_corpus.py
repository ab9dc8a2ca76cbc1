"""`zoo embed` and `zoo classify`: every row of a file through an export, batched by length,
written in row order. The reference is each row run alone through the Python API (batch of
one, no sorting; tests/runtime/test_api.py checks that against the formula in PyTorch)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

import commands.corpus
import runtime.corpus
from runtime.corpus import length_batches
from runtime.files.tokenizer import ByteTokenizer
from tests.conftest import ON_CLASSIFIER
from tests.support.corpus import lines_file, with_byte_tokenizer
from tests.support.helpers import assert_error_after_progress, assert_one_line_error, zoo
from zoo import load

pytestmark = ON_CLASSIFIER  # the worker that makes classifier_export once

# Mixed lengths in no order, so sorting by length moves rows; one past ASCII (two bytes).
TEXTS = ["ROMEO: what light", "a", "Is this a dagger which I see before me, the handle toward",
         "to be", "O, été", "Friends, Romans, countrymen", "xy", "lend me your ears; I come"]


@pytest.fixture(scope="module")
def folder(classifier_export: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The shared classifier export with the byte tokenizer its card's vocabulary is."""
    return with_byte_tokenizer(classifier_export, tmp_path_factory.mktemp("corpus"))


@pytest.mark.parametrize("budget", [None, 40])  # the machine's batches; many small ones
def test_embed_writes_each_rows_vector_in_row_order(
        folder: Path, tmp_path: Path, budget: int | None, monkeypatch: pytest.MonkeyPatch
        ) -> None:
    if budget is not None:
        monkeypatch.setattr(commands.corpus, "token_budget", lambda threads: budget)
    out = tmp_path / "vectors.npy"
    result = zoo("embed", str(folder), "--data", str(lines_file(tmp_path / "t.txt", TEXTS)),
                 "-o", str(out))
    assert result.exit_code == 0, result.output
    assert "rows/s" in result.stderr and f"rows {len(TEXTS)}/{len(TEXTS)}" in result.stderr
    vectors = np.load(out, allow_pickle=False)
    model = load(folder)
    alone = np.concatenate([model.embed([text]) for text in TEXTS])
    assert vectors.shape == alone.shape and vectors.dtype == np.float32
    np.testing.assert_allclose(vectors, alone, atol=1e-5, rtol=0)


def test_classify_writes_each_rows_label_and_probabilities_in_row_order(
        folder: Path, tmp_path: Path) -> None:
    data = tmp_path / "rows.jsonl"
    data.write_text("".join(json.dumps({"id": i, "body": t}) + "\n" for i, t in enumerate(TEXTS)))
    out = tmp_path / "labels.jsonl"
    result = zoo("classify", str(folder), "--data", str(data), "--column", "body", "-o", str(out))
    assert result.exit_code == 0, result.output
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    model = load(folder)
    assert len(rows) == len(TEXTS)
    for row, text in zip(rows, TEXTS, strict=True):
        expected = model.classify(text)[0]
        assert row["label"] == next(iter(expected))  # the most likely first
        assert row["probabilities"] == pytest.approx(expected, abs=1e-5)


def test_a_csv_text_column_is_read(folder: Path, tmp_path: Path) -> None:
    data = tmp_path / "rows.csv"
    data.write_text("id,text\n" + "".join(f'{i},"{t}"\n' for i, t in enumerate(TEXTS[:3])))
    out = tmp_path / "v.npy"
    assert zoo("embed", str(folder), "--data", str(data), "-o", str(out)).exit_code == 0
    np.testing.assert_allclose(np.load(out), load(folder).embed(TEXTS[:3]), atol=1e-5)


@pytest.mark.parametrize("name, content, parts", [
    ("t.txt", "to be\n\nor not\n", ("t.txt:2:", "non-empty 'text'")),
    ("r.jsonl", '{"text": "a"}\n{"text": "b"\n', ("r.jsonl:2:", "not a JSON object")),
    ("r.jsonl", '{"text": "a"}\n{"body": "b"}\n', ("r.jsonl:2:", "an object with 'text'")),
    ("r.jsonl", '{"text": "a"}\n{"text": "  "}\n', ("r.jsonl:2:", "non-empty 'text'")),
    ("r.csv", "id,body\n1,a\n", ("r.csv:1:", "should name 'text'")),
    ("r.csv", "id,text\n1,a\n2\n", ("r.csv:3:", "1 columns, the header has 2")),
    ("long.txt", "a\n" + "x" * 200 + "\n", ("long.txt:2:", "200 tokens, past max_positions=128",
                                            "--truncate")),
])
def test_a_bad_row_is_one_error_naming_file_and_line_and_nothing_is_written(
        folder: Path, tmp_path: Path, name: str, content: str, parts: tuple[str, ...]) -> None:
    data = tmp_path / name
    data.write_text(content, encoding="utf-8")
    out = tmp_path / "out" / "v.npy"
    out.parent.mkdir()
    assert_one_line_error(zoo("embed", str(folder), "--data", str(data), "-o", str(out)), *parts)
    assert list(out.parent.iterdir()) == []


def test_truncate_cuts_long_rows_to_max_positions(folder: Path, tmp_path: Path) -> None:
    data = lines_file(tmp_path / "long.txt", ["x" * 200])
    out = tmp_path / "v.npy"
    assert zoo("embed", str(folder), "--data", str(data), "--truncate", "-o",
               str(out)).exit_code == 0
    np.testing.assert_allclose(np.load(out), load(folder).embed(["x" * 128]), atol=1e-5)


def test_an_existing_output_is_kept_without_force_and_on_failure(
        folder: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    data = lines_file(tmp_path / "t.txt", TEXTS)
    out = tmp_path / "out" / "labels.jsonl"
    out.parent.mkdir()
    out.write_text("earlier\n")
    assert_one_line_error(zoo("classify", str(folder), "--data", str(data), "-o", str(out)),
                          "already exists", "--force")
    assert out.read_text() == "earlier\n"
    # With --force, a run that fails after its first batch leaves the old file whole.
    real = runtime.corpus.run_sequences
    calls = []

    def fails_later(engine: object, prompts: list) -> object:
        calls.append(1)
        if len(calls) > 1:
            raise OSError(28, "No space left on device")
        return real(engine, prompts)

    monkeypatch.setattr(runtime.corpus, "run_sequences", fails_later)
    monkeypatch.setattr(commands.corpus, "token_budget", lambda threads: 40)
    failed = zoo("classify", str(folder), "--data", str(data), "-o", str(out), "--force")
    assert_error_after_progress(failed, "No space left on device", code=1)
    assert out.read_text() == "earlier\n" and list(out.parent.iterdir()) == [out]
    monkeypatch.undo()
    assert zoo("classify", str(folder), "--data", str(data), "-o", str(out),
               "--force").exit_code == 0
    assert len(out.read_text().splitlines()) == len(TEXTS)


def test_length_batches_cover_every_row_once_within_the_budget() -> None:
    rng = np.random.default_rng(0)
    lengths = rng.integers(1, 60, 500).tolist()
    batches = length_batches(lengths, budget=256)
    assert sorted(i for batch in batches for i in batch) == list(range(500))
    for batch in batches:
        assert len(batch) * max(lengths[i] for i in batch) <= 256 or len(batch) == 1
    # Shortest first: each batch's rows are no longer than the next batch's.
    for first, second in zip(batches, batches[1:], strict=False):
        assert max(lengths[i] for i in first) <= min(lengths[i] for i in second)


def test_a_whole_text_gets_the_tokenizer_json_special_tokens(tmp_path: Path) -> None:
    """As transformers' tokenizer(text) and sentence-transformers' encode read it: [CLS] ...
    [SEP]; a prompt to continue (`encode`) gets none; neither is padded nor cut."""
    from tokenizers import Tokenizer, models, pre_tokenizers, processors

    from runtime.files.tokenizer import HuggingFaceTokenizer, sequence_ids

    vocab = {"[UNK]": 0, "[CLS]": 1, "[SEP]": 2, "to": 3, "be": 4}
    backend = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    backend.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", special_tokens=[("[CLS]", 1), ("[SEP]", 2)])
    # Padding and truncation as all-MiniLM-L6-v2's tokenizer.json has them: the zoo pads
    # batches itself (with a mask), so neither may reach the ids.
    backend.enable_padding(length=8, pad_id=0)
    backend.enable_truncation(max_length=3)
    backend.save(str(tmp_path / "tokenizer.json"))
    tokenizer = HuggingFaceTokenizer(tmp_path / "tokenizer.json")
    assert sequence_ids(tokenizer, "to be") == [1, 3, 4, 2]
    assert tokenizer.encode("to be") == [3, 4]
    assert sequence_ids(ByteTokenizer(), "to") == [116, 111]
