"""Hostile folders stay in their folder: every path read from a file (manifest entries, ONNX
external-data locations, modules.json, tokenizer and vocabulary files) that is absolute, climbs
out, or is a symlink out is refused in one line naming the file and the field, exit 2, and
nothing is read or written outside the folder a command names."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from registry.errors import ZooError
from runtime.contract import MANIFEST
from runtime.files.tokenizer import tokenizer_files
from tests.support.folders import fake_export
from tests.support.helpers import assert_one_line_error, zoo


def files_under(folder: Path) -> set[str]:
    return {str(p.relative_to(folder)) for p in folder.rglob("*")}


# --- exports: a one-graph decoder export whose weight lives in an external file -------------


@pytest.mark.parametrize("location, says", [
    ("../secret.bin", "leaves the folder"),
    ("../../../../b/c/d/exp/payload.bin", "leaves the folder"),
    ("/etc/hostname", "is an absolute path"),
])
def test_triton_refuses_external_data_outside_the_export(tmp_path: Path, location: str,
                                                          says: str) -> None:
    (tmp_path / "secret.bin").write_bytes(b"\0" * 16)
    export = fake_export(tmp_path / "a" / "exp", location)
    before = files_under(tmp_path)
    result = zoo("triton", str(export), "-o", str(tmp_path / "repo"))
    assert_one_line_error(result, "onnx/model.onnx", "external data location", repr(location), says)
    assert files_under(tmp_path) == before  # no repository, no file linked or made anywhere


def test_triton_refuses_external_data_symlinked_out_of_the_export(tmp_path: Path) -> None:
    (tmp_path / "secret.bin").write_bytes(b"\0" * 16)
    export = fake_export(tmp_path / "exp", "data.bin")
    (export / "onnx" / "data.bin").symlink_to(tmp_path / "secret.bin")
    result = zoo("triton", str(export), "-o", str(tmp_path / "repo"))
    assert_one_line_error(result, "'data.bin'", "is a symlink out of the folder")
    assert not (tmp_path / "repo").exists()


def test_triton_still_places_external_data_inside_the_export(tmp_path: Path) -> None:
    """The check refuses only what leaves: a location inside is linked as before (the graph
    here is no real gpt-tiny, so the config step then refuses it, after the data was found)."""
    export = fake_export(tmp_path / "exp", "data.bin")
    (export / "onnx" / "data.bin").write_bytes(b"\0" * 16)
    result = zoo("triton", str(export), "-o", str(tmp_path / "repo"))
    assert "external data" not in result.output and "Traceback" not in result.output


@pytest.mark.parametrize("field", ["files", "graphs"])
def test_a_manifest_naming_a_file_outside_its_folder_is_refused_before_it_is_read(
        tmp_path: Path, field: str) -> None:
    export = fake_export(tmp_path / "exp", "data.bin")
    manifest = json.loads((export / MANIFEST).read_text())
    manifest[field]["../secret.bin"] = {"sha256": "0" * 64, "inputs": [], "outputs": []}
    (export / MANIFEST).write_text(json.dumps(manifest))
    (tmp_path / "secret.bin").write_bytes(b"secret")
    for command in (["parity", str(export)], ["triton", str(export), "-o", str(tmp_path / "r")]):
        assert_one_line_error(zoo(*command), MANIFEST, field, "'../secret.bin'",
                              "leaves the folder")
    assert not (tmp_path / "r").exists()


@pytest.mark.parametrize("layout", [{"graphs": {"../secret.onnx": {}}}, "x", {},
                                    {"graphs": ["../secret.onnx"]}])
def test_a_manifest_layout_naming_a_file_outside_or_nothing_is_one_line(
        tmp_path: Path, layout: object) -> None:
    """The clients' layout entry: its graphs are checked as `graphs` are (a list of names was
    not checked at all), and one that is not a mapping of graphs is refused in one line."""
    export = fake_export(tmp_path / "exp", "data.bin")
    manifest = json.loads((export / MANIFEST).read_text())
    manifest["layout"] = layout
    (export / MANIFEST).write_text(json.dumps(manifest))
    (tmp_path / "secret.onnx").write_bytes(b"secret")
    outside = layout == {"graphs": {"../secret.onnx": {}}}
    says = (["'../secret.onnx'", "leaves the folder"] if outside
            else ["field 'layout' should hold 'graphs'"])
    assert_one_line_error(zoo("parity", str(export)), MANIFEST, *says)


@pytest.mark.parametrize("stored_as", [{"onnx/model.onnx": "../secret.onnx"},
                                       {"onnx/model.onnx": ["onnx/model.onnx"]}, "model.onnx"])
def test_a_manifest_whose_stored_as_names_no_listed_graph_is_one_line(
        tmp_path: Path, stored_as: object) -> None:
    """quantization.stored_as only renames graphs `graphs` lists (whose paths are checked):
    anything else is refused in one line, before any session opens."""
    export = fake_export(tmp_path / "exp", "data.bin")
    manifest = json.loads((export / MANIFEST).read_text())
    manifest["quantization"] = {"weights": "int4", "stored_as": stored_as}
    (export / MANIFEST).write_text(json.dumps(manifest))
    assert_one_line_error(zoo("run", str(export), "--ids", "1"), MANIFEST, "quantization.stored_as",
                          "graphs listed in 'graphs'")


# --- imports --------------------------------------------------------------------------------

def sentence_folder(folder: Path, transformer: str, pooling: str) -> Path:
    folder.mkdir(parents=True)
    modules = [{"idx": 0, "name": "0", "path": transformer,
                "type": "sentence_transformers.models.Transformer"},
               {"idx": 1, "name": "1", "path": pooling,
                "type": "sentence_transformers.models.Pooling"}]
    (folder / "modules.json").write_text(json.dumps(modules))
    return folder


@pytest.mark.parametrize("transformer, pooling, field, says", [
    ("../bert", "1_Pooling", "modules[0].path", "leaves the folder"),
    ("", "/tmp/elsewhere/1_Pooling", "modules[1].path", "is an absolute path"),
])
def test_import_refuses_sentence_modules_outside_the_folder(
        tmp_path: Path, transformer: str, pooling: str, field: str, says: str) -> None:
    (tmp_path / "bert").mkdir()  # an outside model the path would have imported
    (tmp_path / "bert" / "config.json").write_text("{}")
    source = sentence_folder(tmp_path / "st", transformer, pooling)
    result = zoo("import", str(source), "-o", str(tmp_path / "out"))
    assert_one_line_error(result, "modules.json", field, says)
    assert not (tmp_path / "out").exists()


def test_import_refuses_a_module_folder_symlinked_out(tmp_path: Path) -> None:
    (tmp_path / "bert").mkdir()
    source = sentence_folder(tmp_path / "st", "0_Transformer", "1_Pooling")
    (source / "0_Transformer").symlink_to(tmp_path / "bert", target_is_directory=True)
    assert_one_line_error(zoo("import", str(source), "-o", str(tmp_path / "out")),
                          "modules[0].path", "is a symlink out of the folder")


def marian_folder(folder: Path) -> Path:
    """Enough of a MarianMT folder to reach its tokenizer files: config.json, a weights file
    (never read: the tokenizer files are checked first) and sentencepiece files."""
    import transformers

    folder.mkdir(parents=True)
    transformers.MarianConfig(vocab_size=16, d_model=8, encoder_layers=1, decoder_layers=1,
                              encoder_attention_heads=2, decoder_attention_heads=2,
                              encoder_ffn_dim=16, decoder_ffn_dim=16, max_position_embeddings=16,
                              pad_token_id=15, decoder_start_token_id=15).save_pretrained(folder)
    (folder / "model.safetensors").write_bytes(b"not read")
    for name in ("source.spm", "target.spm"):
        (folder / name).write_bytes(b"garbage, not a sentencepiece model")
    (folder / "vocab.json").write_text(json.dumps({"</s>": 0, "<unk>": 1, "<pad>": 15}))
    return folder


@pytest.mark.parametrize("name, target", [("vocab.json", "/etc/passwd"),
                                          ("target_vocab.json", "/etc/hostname")])
def test_import_refuses_tokenizer_files_symlinked_to_system_files(tmp_path: Path, name: str,
                                                                  target: str) -> None:
    source = marian_folder(tmp_path / "opus")
    (source / name).unlink(missing_ok=True)
    (source / name).symlink_to(target)
    assert_one_line_error(zoo("import", str(source), "-o", str(tmp_path / "out")),
                          f"'{name}'", "is a symlink out of the folder")
    assert not (tmp_path / "out").exists()


def test_import_opens_a_sentencepiece_model_before_copying_it(tmp_path: Path) -> None:
    pytest.importorskip("sentencepiece")
    source = marian_folder(tmp_path / "opus")
    assert_one_line_error(zoo("import", str(source), "-o", str(tmp_path / "out")),
                          "source.spm", "not a sentencepiece model")
    assert not (tmp_path / "out").exists()


def test_tokenizer_files_copied_into_exports_stay_in_their_folder(tmp_path: Path) -> None:
    """`zoo export` and `zoo train` copy a model folder's tokenizer files through this."""
    (tmp_path / "model").mkdir()
    (tmp_path / "elsewhere.json").write_text(json.dumps({"kind": "bytes"}))
    os.symlink(tmp_path / "elsewhere.json", tmp_path / "model" / "byte-tokenizer.json")
    with pytest.raises(ZooError, match="'byte-tokenizer.json' is a symlink out of the folder"):
        tokenizer_files(tmp_path / "model")
    (tmp_path / "model" / "byte-tokenizer.json").unlink()
    (tmp_path / "model" / "tokenizer.json").write_text("{not json")
    with pytest.raises(ZooError, match="not a readable tokenizer.json"):
        tokenizer_files(tmp_path / "model")
