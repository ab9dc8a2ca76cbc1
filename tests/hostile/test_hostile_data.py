"""Hostile data files and output files (issue 37, items 4, 8, 9): a second run into a command's
output file is refused in one line and the first's file kept; a file someone makes while a
command runs is not replaced without --force; every reader of CSV, JSONL and text data refuses
a broken file in one line naming file and line; and config.json (or a sentence-transformers
file) with a value of the wrong type is one line naming file, key and the type expected."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import matplotlib.figure
import numpy as np
import pytest

import commands.corpus
import export.bench.run
import export.inspect.attention
from runtime.files.texts import read_texts
from runtime.files.tokenizer import BYTE_TOKENIZER
from tests.conftest import ON_CLASSIFIER
from tests.support.corpus import lines_file, with_byte_tokenizer
from tests.support.helpers import assert_error_after_progress, assert_one_line_error, zoo
from zoo import load

pytestmark = ON_CLASSIFIER  # the worker that makes classifier_export once

ROOT = Path(__file__).resolve().parents[2]
TEXTS = ["ROMEO: what light", "a", "Is this a dagger which I see before me"]
LOCKED = "another zoo run is writing it"


@pytest.fixture(scope="module")
def folder(classifier_export: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The shared classifier export (it has a sentence vector) with a byte tokenizer."""
    return with_byte_tokenizer(classifier_export, tmp_path_factory.mktemp("hostile-data"))


def python(code: str, *args: str | Path, **kwargs: object) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", code, *map(str, args)], cwd=ROOT,
                            text=True, **kwargs)  # type: ignore[call-overload]


def wait_for(path: Path, process: subprocess.Popen, seconds: float = 180) -> None:
    deadline = time.monotonic() + seconds
    while not path.exists():
        assert process.poll() is None, process.communicate()
        assert time.monotonic() < deadline, f"{path} never appeared"
        time.sleep(0.05)


# --- item 4: outputs that are files --------------------------------------------------------

# `zoo embed ARGS` in a fresh interpreter, held after its early checks until GO exists.
HELD_EMBED = """
import sys, time
from pathlib import Path
import commands.corpus as corpus
holding, go = Path(sys.argv[1]), Path(sys.argv[2])
real = corpus.run_corpus
def held(*args, **kwargs):
    holding.touch()
    while not go.exists():
        time.sleep(0.05)
    return real(*args, **kwargs)
corpus.run_corpus = held
import cli
cli.main(sys.argv[3:], prog_name="zoo")
"""


def test_a_second_embed_into_the_same_new_file_is_refused_and_the_first_kept(
        folder: Path, tmp_path: Path) -> None:
    out = tmp_path / "v.npy"
    few = lines_file(tmp_path / "few.txt", TEXTS)
    many = lines_file(tmp_path / "many.txt", TEXTS * 10)
    holding, go = tmp_path / "holding", tmp_path / "go"
    first = python(HELD_EMBED, holding, go, "embed", folder, "--data", few, "-o", out,
                   stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        wait_for(holding, first)  # the first run is past its checks, its rows not yet written
        for force in ([], ["--force"]):
            second = zoo("embed", folder, "--data", many, "-o", out, *force)
            assert_one_line_error(second, str(out), LOCKED, code=1)
        go.touch()
        stdout, stderr = first.communicate(timeout=300)
    finally:
        first.kill()
    assert first.returncode == 0, stderr
    assert f"wrote {out}" in stdout
    expected = load(folder).embed(TEXTS)  # each row as the Python API embeds it
    np.testing.assert_allclose(np.load(out, allow_pickle=False), expected, atol=1e-5, rtol=0)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["few.txt", "go", "holding",
                                                          "many.txt", "v.npy"]


# Each command that writes a file, as (its arguments for OUT, the call to wrap: it runs after
# the command's early checks and before its write).
def corpus_args(command: str) -> Callable[[Path, Path, Path], list[str | Path]]:
    def args(folder: Path, tmp: Path, out: Path) -> list[str | Path]:
        return [command, folder, "--data", lines_file(tmp / "t.txt", TEXTS), "-o", out]
    return args


WRITERS = {
    "embed": (corpus_args("embed"), "v.npy", (commands.corpus, "run_corpus")),
    "classify": (corpus_args("classify"), "l.jsonl", (commands.corpus, "run_corpus")),
    "bench --json": (lambda folder, tmp, out: ["bench", "gpt-tiny", "--json", out], "b.json",
                     (export.bench.run, "run_bench")),
    "attention -o": (lambda folder, tmp, out: ["attention", "gpt-tiny", "--ids", "5,6,7",
                                               "-o", out], "a.png",
                     (matplotlib.figure.Figure, "savefig")),  # after the grid's own check
    "attention --json": (lambda folder, tmp, out: ["attention", "gpt-tiny", "--ids", "5,6,7",
                                                   "-o", tmp / "a.png", "--json", out],
                         "a.json", (export.inspect.attention, "look")),
    "plot schedule": (lambda folder, tmp, out: ["plot", "schedule", "gpt-tiny", "-o", out],
                      "lr.png", (matplotlib.figure.Figure, "savefig")),
}


@pytest.mark.parametrize("command", list(WRITERS))
def test_a_file_made_while_the_command_runs_is_not_replaced_without_force(
        command: str, folder: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    make_args, name, (owner, attribute) = WRITERS[command]
    out = tmp_path / "out" / name
    out.parent.mkdir()
    real = getattr(owner, attribute)

    def theirs_first(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202
        out.write_bytes(b"someone else's")  # after the early check found no file
        if owner is export.bench.run:
            return {}  # the figures, not measured: only their write is under test
        return real(*args, **kwargs)

    monkeypatch.setattr(owner, attribute, theirs_first)
    result = zoo(*make_args(folder, tmp_path, out))  # refused after its rows' progress
    assert_error_after_progress(result, str(out), "already exists", "--force")
    assert out.read_bytes() == b"someone else's"
    assert [p.name for p in out.parent.iterdir()] == [name]  # no temporary, no lock left


LOCK_HOLDER = """
import sys
from pathlib import Path
from runtime.files.lock import output_lock
with output_lock(Path(sys.argv[1])):
    print("held", flush=True)
    sys.stdin.read()
"""


@pytest.mark.parametrize("command", list(WRITERS))
def test_a_file_another_run_is_writing_is_refused_with_exit_1(
        command: str, folder: Path, tmp_path: Path) -> None:
    make_args, name, _ = WRITERS[command]
    out = tmp_path / "out" / name
    out.parent.mkdir()
    holder = python(LOCK_HOLDER, out, stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    try:
        assert holder.stdout is not None and holder.stdout.readline() == "held\n"
        result = zoo(*make_args(folder, tmp_path, out))
        assert_one_line_error(result, str(out), LOCKED, code=1)
        assert not out.exists()
    finally:
        holder.communicate(timeout=60)


# --- item 8: data files --------------------------------------------------------------------

UNCLOSED = 'text,"label\n' + "hello,a\n" * 20_000  # the quote swallows the file: > 128 KiB
HOSTILE = {  # name -> (file name, contents, what the one line says)
    "unclosed quote in the header": ("data.csv", UNCLOSED.encode(),
                                     "data.csv:1: a quoted field opened here is never closed"),
    "unclosed quote, short": ("data.csv", b'text,label\n"hello,a\nbye,b\n',
                              "data.csv:2: a quoted field opened here is never closed"),
    "stray quote": ("data.csv", b'text,label\n"a"b,x\n', "data.csv:2: not valid CSV"),
    "NUL byte": ("data.csv", b"text,label\nhi\0there,a\n", "data.csv:2: a NUL byte"),
    "UTF-16": ("data.csv", "text,label\nhi,a\n".encode("utf-16"), "data.csv: UTF-16"),
    "not UTF-8": ("data.csv", b"text,label\nh\xffi,a\n", "data.csv:2: not UTF-8 text"),
    "JSON nested deeply": ("data.jsonl", b'{"text": ' + b"[" * 100_000 + b"]" * 100_000 + b"}\n",
                           "data.jsonl:1: not a JSON object"),
    "a cell of 10**5 items": ("data.jsonl", b'{"text": [' + b"1," * 100_000 + b'1], '
                              b'"label": "a"}\n', "data.jsonl:1: expected a non-empty 'text'"),
    "JSON number of 5000 digits": ("data.jsonl", b'{"text": "a", "label": ' + b"1" * 5000
                                   + b"}\n", "data.jsonl:1: not a JSON object"),
}
READERS = {  # name -> arguments reading the file DATA (FOLDER: the classifier export)
    "embed": ["embed", "{folder}", "--data", "{data}", "-o", "{tmp}/v.npy"],
    "classify --label-column": ["classify", "{folder}", "--data", "{data}", "--label-column",
                                "label", "-o", "{tmp}/l.jsonl"],
    "train --task classify": ["train", "bert-tiny", "--task", "classify", "--data", "{data}",
                              "-o", "{tmp}/trained"],
    "evaluate --data": ["evaluate", "{folder}", "--data", "{data}"],
    "export --calibration": ["export", "bert-tiny", "--onnx", "--quantize", "int8-dynamic",
                             "--calibration", "{data}", "-o", "{tmp}/exported"],
}


# Every case through both readings (texts: read_texts; labelled rows: read_rows), the issue's
# case through every command that reads data.
PAIRS = ([(case, reader) for case in HOSTILE for reader in ("embed", "train --task classify")]
         + [("unclosed quote in the header", reader) for reader in READERS
            if reader not in ("embed", "train --task classify")])


@pytest.mark.parametrize(("case", "reader"), PAIRS)
def test_a_broken_data_file_is_one_line_naming_file_and_line(
        case: str, reader: str, folder: Path, tmp_path: Path) -> None:
    name, contents, message = HOSTILE[case]
    data = tmp_path / name
    data.write_bytes(contents)
    args = [a.format(folder=folder, data=data, tmp=tmp_path) for a in READERS[reader]]
    line = assert_error_after_progress(zoo(*args), message)  # export says what it loads
    assert len(line) < 400, line  # the rest of the file is not echoed into the line
    assert sorted(p.name for p in tmp_path.iterdir()) == [name]  # nothing written


@pytest.mark.parametrize(("contents", "message"), [
    (b"to be\0or not\n", "data.txt:1: a NUL byte"),
    ("to be\n".encode("utf-16"), "data.txt: UTF-16"),
    (b"to be\nor n\xfft\n", "data.txt:2: not UTF-8 text"),
])
def test_a_broken_text_is_one_line_for_every_text_reader(contents: bytes, message: str,
                                                          folder: Path, tmp_path: Path) -> None:
    data = tmp_path / "data.txt"
    data.write_bytes(contents)
    for args in (["embed", folder, "--data", data, "-o", tmp_path / "v.npy"],  # read_texts
                 ["train", "gpt-tiny", "--task", "lm", "--data", data, "-o", tmp_path / "t"]):
        assert_one_line_error(zoo(*args), message)


def test_lines_are_split_at_newlines_only(tmp_path: Path) -> None:
    """A form feed or U+2028 inside a line is not a row break: the rows and their numbers are
    the file's lines, as `bytes.split(b"\\n")` counts them."""
    raw = "one\u2028two\nthree\x0cfour\r\nfive\n".encode()
    data = tmp_path / "rows.txt"
    data.write_bytes(raw)
    expected = [(line.decode().removesuffix("\r"), number)
                for number, line in enumerate(raw.split(b"\n")[:-1], start=1)]
    assert [(row.text, row.line) for row in read_texts(data)] == expected


# --- item 9: config.json's types -----------------------------------------------------------

CONFIGS = {  # name -> (config.json, the key, what the line expects)
    "architectures": ({"model_type": "gpt2", "architectures": 5}, "architectures",
                      "a list of strings"),
    "architectures' items": ({"architectures": [["GPT2Model"]]}, "architectures",
                             "a list of strings"),
    "model_type": ({"model_type": 5}, "model_type", "a string"),
    "an activation": ({"model_type": "llama", "hidden_act": ["silu"]}, "hidden_act",
                      "a string"),
    "a size": ({"model_type": "llama", "vocab_size": "32000"}, "vocab_size",
               "a whole number"),
    "a flag": ({"model_type": "llama", "tie_word_embeddings": "yes"}, "tie_word_embeddings",
               "true or false"),
    "a number": ({"model_type": "llama", "rope_theta": "1e4"}, "rope_theta", "a number"),
    "a scaling's kind": ({"model_type": "llama", "rope_scaling": {"rope_type": ["linear"]}},
                         "rope_scaling.rope_type", "a string"),
    "a token id": ({"model_type": "gpt2", "eos_token_id": "50256"}, "eos_token_id",
                   "a token id"),
    "a class name": ({"model_type": "bert", "id2label": {"0": {"name": "a"}}}, "id2label",
                     "an object of strings"),
}


@pytest.mark.parametrize("case", list(CONFIGS))
def test_a_config_value_of_the_wrong_type_is_one_line(case: str, tmp_path: Path) -> None:
    config, key, expected = CONFIGS[case]
    source = tmp_path / "source"
    source.mkdir()
    (source / "config.json").write_text(json.dumps(config))
    result = zoo("import", source, "-o", tmp_path / "out")
    assert_one_line_error(result, "config.json", f"{key} should be {expected}")
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(("files", "message"), [
    ({"modules.json": [{"type": 5, "path": ""}]}, "modules[0].type should be a string"),
    ({"modules.json": [{"type": "sentence_transformers.models.Pooling", "path": 1}]},
     "modules[0].path should be a string"),
    ({"modules.json": [{"type": "sentence_transformers.models.Pooling", "path": "p"}],
      "p/config.json": {"pooling_mode_mean_tokens": "yes"}},
     "pooling_mode_mean_tokens should be true or false"),
])
def test_a_sentence_transformers_file_of_the_wrong_type_is_one_line(
        files: dict[str, object], message: str, tmp_path: Path) -> None:
    source = tmp_path / "source"
    for name, content in files.items():
        (source / name).parent.mkdir(parents=True, exist_ok=True)
        (source / name).write_text(json.dumps(content))
    assert_one_line_error(zoo("import", source, "-o", tmp_path / "out"), message)


GOOD_STEP = b'{"step": 1, "loss": 2.0, "lr": 0.1}\n'


@pytest.mark.parametrize(("line", "message"), [
    (b'{"step": Infinity, "loss": 2.0, "lr": 0.1}', "metrics.jsonl line 2: expected JSON"),
    (b'{"step": 2, "loss": 1' + b"0" * 400 + b', "lr": 0.1}', "metrics.jsonl line 2"),
    (b'{"step": ' + b"[" * 100_000 + b"]" * 100_000 + b"}", "metrics.jsonl line 2"),
    (b'{"step": 2, "loss": "\xff", "lr": 0.1}', "metrics.jsonl:2: not UTF-8 text"),
])
def test_a_broken_metrics_file_is_one_line_for_zoo_plot_training(
        line: bytes, message: str, tmp_path: Path) -> None:
    run = tmp_path / "run"
    run.mkdir()
    (run / "metrics.jsonl").write_bytes(GOOD_STEP + line + b"\n")
    result = zoo("plot", "training", run, "-o", tmp_path / "c.png")
    assert_one_line_error(result, message)
    assert not (tmp_path / "c.png").exists()


def test_a_resumed_run_drops_a_garbled_metrics_line(tmp_path: Path) -> None:
    from zoo.training.metrics import truncate_metrics

    lines = [GOOD_STEP, b'{"step": 2, "loss": 1.5, "lr": 0.1}\n', b'{"step": \xff\n',
             b'{"step": Infinity}\n', b'{"step": 3, "loss": 1.0, "lr": 0.1}\n']
    (tmp_path / "metrics.jsonl").write_bytes(b"".join(lines))
    truncate_metrics(tmp_path, 2)  # the checkpoint a resumed run starts from
    assert (tmp_path / "metrics.jsonl").read_bytes() == b"".join(lines[:2])


@pytest.mark.parametrize("name", ["config.json", "modules.json"])
def test_json_nested_past_the_stack_is_one_line(name: str, tmp_path: Path) -> None:
    source = tmp_path / "source"
    source.mkdir()
    (source / name).write_bytes(b'{"a": ' + b"[" * 100_000 + b"]" * 100_000 + b"}")
    result = zoo("import", source, "-o", tmp_path / "out")
    assert_one_line_error(result, f"{name}: not valid JSON: nested too deeply")


def test_a_tokenizer_file_nested_past_the_stack_is_one_line(folder: Path, tmp_path: Path
                                                            ) -> None:
    copy = tmp_path / "export"
    shutil.copytree(folder, copy)
    (copy / BYTE_TOKENIZER).write_bytes(b'{"kind": ' + b"[" * 100_000 + b"]" * 100_000 + b"}")
    result = zoo("embed", copy, "--data", lines_file(tmp_path / "t.txt", TEXTS), "-o",
                 tmp_path / "v.npy")
    assert_one_line_error(result, f"{BYTE_TOKENIZER}: not a byte tokenizer file")


def test_a_manifest_nested_past_the_stack_is_one_line(tmp_path: Path) -> None:
    """manifest.json is the first file every command reads from an export."""
    folder = tmp_path / "export"
    folder.mkdir()
    (folder / "manifest.json").write_bytes(b'{"files": ' + b"[" * 100_000 + b"]" * 100_000
                                           + b"}")
    result = zoo("run", folder, "--ids", "1,2")
    assert_one_line_error(result, "manifest.json: not valid JSON")


@pytest.mark.parametrize(("fields", "message"), [
    ({"files": {"model.onnx": 5}}, "field 'files' should map each file name to its entry"),
    ({"files": {}}, "field 'card' should hold the card"),
    ({"files": {}, "card": {}, "generation": "x"}, "field 'generation' should hold the 'file'"),
    ({"files": {}, "card": {}, "generation": {}}, "field 'generation' should hold the 'file'"),
])
def test_an_edited_manifest_is_one_line(fields: dict, message: str, tmp_path: Path) -> None:
    """The manifest's own fields are nobody's sha256: an edited one is refused by field."""
    from runtime.manifest import FORMAT_VERSION

    folder = tmp_path / "export"
    folder.mkdir()
    (folder / "manifest.json").write_text(json.dumps({"format_version": FORMAT_VERSION,
                                                      **fields}), encoding="utf-8")
    assert_one_line_error(zoo("run", folder, "--ids", "1,2"), "manifest.json", message)
