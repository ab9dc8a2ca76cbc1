"""Hostile inputs found by a battery, each refused in one line with exit code 2, no traceback,
and nothing written: absurd sizes in cards and config.json, a class id of 10**15 (and many
distinct labels, in linear time), --text that is not UTF-8, and --ids past the vocabulary,
negative, or longer than max_positions."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from registry.errors import ZooError
from registry.schema import MAX_LABELS
from runtime.files.labelled import Example, Rows, classes, label_ids
from runtime.prompts import check_ids
from tests.conftest import SharedExport, card, on_shared
from tests.support.helpers import assert_one_line_error, zoo

ROOT = Path(__file__).resolve().parents[2]
HUGE = 10**15
GPT2 = dict(n_layer=2, n_embd=32, n_head=4, n_positions=64, vocab_size=100)
BERT = dict(num_hidden_layers=2, hidden_size=32, num_attention_heads=4, intermediate_size=64,
            max_position_embeddings=64, vocab_size=100)


@pytest.fixture(autouse=True)
def _isolated(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("ZOO_PATH", raising=False)


# --- 1. absurd sizes: the card schema, and config.json against its weights ----------------

@pytest.mark.parametrize("field, value", [
    ("vocab_size", HUGE), ("max_positions", HUGE), ("d_model", 2**20), ("n_layers", 10**6),
    ("d_ff", 10**9), ("num_labels", HUGE),
])
def test_a_card_with_an_absurd_size_is_refused_by_validation(field: str, value: int,
                                                             tmp_path: Path) -> None:
    assert_one_line_error(zoo("build", "gpt-tiny", "--set", f"{field}={value}",
                              "-o", tmp_path / "out"), f"--set: {field}={value} should be <=")
    assert not (tmp_path / "out").exists()


def hf_folder(root: Path, kind: str, **config: int) -> Path:
    """A small random GPT-2 or BERT folder as transformers saves it, then config.json's keys
    overwritten with `config` (the weights keep their real shapes)."""
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    model = (transformers.GPT2LMHeadModel(transformers.GPT2Config(**GPT2)) if kind == "gpt2"
             else transformers.BertModel(transformers.BertConfig(**BERT)))
    folder = root / kind
    model.save_pretrained(folder, safe_serialization=True)
    path = folder / "config.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), **config}))
    return folder


@pytest.mark.parametrize("kind, key, value", [
    ("gpt2", "vocab_size", HUGE),  # was torch's "you tried to allocate 128000000000000000 bytes"
    ("gpt2", "n_positions", HUGE),
    ("gpt2", "vocab_size", 3_000_000),  # within the schema's bound, not this file's tensors
    ("gpt2", "n_layer", 500),
    ("bert", "max_position_embeddings", HUGE),
    ("bert", "vocab_size", HUGE),
])
def test_import_refuses_a_config_its_weights_cannot_fill(kind: str, key: str, value: int,
                                                        tmp_path: Path) -> None:
    source = hf_folder(tmp_path, kind, **{key: value})
    assert_one_line_error(zoo("import", source, "-o", tmp_path / "out"),
                          f"{kind}/config.json: {key}={value} disagrees with",
                          "model.safetensors")
    assert not (tmp_path / "out").exists()


# --- 2. labels: linear in their number, and a class id of 10**15 refused -------------------

def test_many_distinct_labels_map_in_linear_time() -> None:
    """20,000 distinct names: `names.index` per row took about 6 s here, a dict 0.01 s."""
    count = 20_000
    rows = Rows("many.jsonl", [Example("text", f"L{i}", i + 1) for i in range(count)])
    start = time.perf_counter()
    names, num_labels = classes(rows, None, 0)
    ids = label_ids(rows, names, num_labels)
    assert time.perf_counter() - start < 2.0
    assert num_labels == count and names == sorted(names)
    assert [names[i] for i in ids] == [example.label for example in rows.examples]


def test_label_ids_by_id_and_unknown_labels() -> None:
    rows = Rows("ids.jsonl", [Example("a", "2", 1), Example("b", "0", 2), Example("c", "01", 3)])
    assert classes(rows, None, 0) == (None, 3)
    assert label_ids(rows, None, 3) == [2, 0, 1]
    with pytest.raises(ZooError, match=r"ids.jsonl:1: label '2' is not one of the classes"):
        label_ids(rows, None, 2)
    with pytest.raises(ZooError, match=r"names.jsonl:2: label 'c' is not one of the classes"):
        label_ids(Rows("names.jsonl", [Example("x", "a", 1), Example("y", "c", 2)]),
                  ["a", "b"], 2)


def test_a_class_id_of_ten_to_the_fifteen_is_refused(tmp_path: Path) -> None:
    """All labels whole numbers are class ids: 10**15 asked for 10**15 + 1 classes (2**57
    bytes of head). Refused naming the file, the line and the label."""
    data = tmp_path / "labels.jsonl"
    data.write_text("".join(json.dumps({"text": text, "label": label}) + "\n" for text, label
                            in (("one", 0), ("two", 1), ("three", HUGE))))
    assert_one_line_error(zoo("train", "gpt-tiny", "--task", "classify", "--data", data,
                              "--steps", "1", "-o", tmp_path / "out"),
                          f"labels.jsonl:3: label '{HUGE}' is too large for a class id",
                          str(MAX_LABELS - 1))
    assert not (tmp_path / "out").exists()


# --- 3. --text that is not UTF-8 ------------------------------------------------------------

def test_run_refuses_text_that_is_not_utf8(tmp_path: Path) -> None:
    """Bytes on the command line arrive as surrogate escapes; encoding them was a traceback."""
    done = subprocess.run([sys.executable, "-m", "cli", "run", str(tmp_path).encode(),
                           "--text", b"\xff\xfe"], cwd=ROOT, capture_output=True, timeout=120,
                          encoding="utf-8")
    assert_one_line_error(done, "--text: not valid UTF-8", "byte 0xff")
    assert list(tmp_path.iterdir()) == []


# --- 4. --ids past the vocabulary, negative, or too long: one check for every family -------

@on_shared("bert-tiny")
@pytest.mark.parametrize("ids, parts", [
    ("5,99999", ["--ids", "token id 99999", "0..259"]),  # was ONNX Runtime's Gather traceback
    ("-1,2,3", ["--ids", "token id -1", "0..259"]),  # silently read as the last token
    (",".join(["5"] * 60_000), ["--ids", "60000 tokens", "max_positions=128"]),
])
def test_encoder_run_refuses_bad_ids(ids: str, parts: list[str],
                                     shared_export: SharedExport) -> None:
    folder, _ = shared_export("bert-tiny")
    before = sorted(path.name for path in folder.iterdir())
    assert_one_line_error(zoo("run", folder, "--ids", ids), *parts)
    assert sorted(path.name for path in folder.iterdir()) == before


@pytest.mark.parametrize("name", ["bert-tiny", "gpt-tiny", "transformer-tiny"])
def test_one_id_check_for_every_family(name: str) -> None:
    tiny = card(name)
    vocab, limit = tiny["vocab_size"], tiny["max_positions"]
    check_ids(tiny, [[0, vocab - 1], [1] * limit])
    for bad, message in (([[1], [vocab]], f"token id {vocab} is not in the vocabulary"),
                         ([[-1]], "token id -1 is not in the vocabulary"),
                         ([[1] * (limit + 1)], f"of {limit + 1} tokens exceeds max_positions")):
        with pytest.raises(ZooError, match=f"^--ids: .*{message}"):
            check_ids(tiny, bad, "--ids")


def test_attention_refuses_a_negative_id(tmp_path: Path) -> None:
    png = tmp_path / "map.png"
    assert_one_line_error(zoo("attention", "bert-tiny", "--ids", "-1,2,3", "-o", png),
                          "--ids: token id -1 is not in the vocabulary", "0..259")
    assert not png.exists()
