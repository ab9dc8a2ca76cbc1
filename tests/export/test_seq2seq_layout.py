"""The encoder-decoder's seq2seq layout for the Hugging Face clients (export/targets/
seq2seq_layout.py): what the manifest says of it, the check that proves it computes what the
export's own graphs compute (and fails on a layout that computes otherwise), the variants that
keep it, and older folders without it, which run and check as before. That the clients load it
and agree with `zoo run` is tests/clients/test_optimum.py's and
tests/clients/test_transformers_js.py's."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import onnx
import pytest
from click.testing import CliRunner
from onnx import numpy_helper

from cli import main as zoo
from export.checks.layout import check_layout
from export.opening import open_export
from export.targets.seq2seq_layout import layout_graphs
from runtime.contract import LAYOUT, LAYOUT_DECODER, LAYOUT_ENCODER, MANIFEST
from runtime.files.spm_tokenizer import SentencePieceTokenizer
from runtime.files.tokenizer import load_tokenizer
from tests.conftest import (
    ON_HF_CLIENTS,
    Lazy,
    SharedExport,
    assert_weights_stored_once,
    card,
    on_shared,
)
from tests.support.contract_doc import documented_layout, documented_stored_name
from tests.support.hf_exports import TRANSLATOR

NAME = "transformer-tiny"


@on_shared(NAME)
def test_the_layout_has_the_documented_names_and_is_in_the_manifest(
        shared_export: SharedExport) -> None:
    """The names docs/onnx-contract.md gives (what the clients feed and fetch), `batch_size`
    first on every input (transformers.js fills in no other axis of an empty cache), weights
    inline (transformers.js fetches no data file it is not told of), and the manifest's
    `layout` and `files` listing both graphs."""
    folder, _ = shared_export(NAME)
    documented = documented_layout(card(NAME))
    manifest = json.loads((folder / MANIFEST).read_text())
    assert list(documented) == [LAYOUT_ENCODER, LAYOUT_DECODER]
    for file, (inputs, outputs) in documented.items():
        graph = onnx.load(str(folder / file), load_external_data=False).graph
        assert [i.name for i in graph.input] == inputs
        assert [o.name for o in graph.output] == outputs
        assert manifest[LAYOUT]["graphs"][file] == {"inputs": inputs, "outputs": outputs}
        for value in graph.input:
            dims = [d.dim_param or d.dim_value for d in value.type.tensor_type.shape.dim]
            assert dims[0] == ("batch_size" if value.name != "use_cache_branch" else 1)
            if value.name.startswith("past_key_values."):
                assert isinstance(dims[2], str) and dims[2] != "batch_size"
        assert not any(t.data_location == onnx.TensorProto.EXTERNAL for t in graph.initializer)
    assert {LAYOUT_ENCODER, LAYOUT_DECODER} <= set(manifest["files"])
    assert set(manifest["graphs"]) == {"encoder.onnx", "decoder.onnx"}  # the contract's own


@on_shared(NAME)
def test_each_layout_graph_stands_alone_with_each_weight_once(shared_export: SharedExport
                                                             ) -> None:
    """The layout is a copy of the model beside the contract's graphs (ONNX Runtime refuses an
    external data path out of onnx/), each file with its weights inline: the merged decoder's
    two branches read one copy of the decoder's weights, and no file holds a weight twice."""
    folder, _ = shared_export(NAME)
    tiny = card(NAME)
    sinusoids = tiny["max_positions"] * tiny["d_model"] * 4  # computed, not in safetensors
    assert_weights_stored_once(folder, sinusoids)  # the contract's graphs, as before
    for file in (LAYOUT_ENCODER, LAYOUT_DECODER):
        assert_weights_stored_once(folder, sinusoids, files=[file])


@on_shared(NAME)
def test_a_changed_layout_graph_is_refused_in_one_line(shared_export: SharedExport,
                                                        tmp_path: Path) -> None:
    changed = Path(shutil.copytree(shared_export(NAME)[0], tmp_path / "changed"))
    with open(changed / LAYOUT_DECODER, "ab") as stream:
        stream.write(b"\0")
    result = CliRunner().invoke(zoo, ["parity", str(changed)])
    assert result.exit_code != 0 and result.output.count("\n") == 1
    assert "decoder_model_merged.onnx: sha256 does not match" in result.output


@on_shared(NAME)
def test_the_check_fails_on_a_layout_that_computes_otherwise(shared_export: SharedExport,
                                                              tmp_path: Path) -> None:
    """The merged decoder made from an encoder whose cross projection is doubled: its first
    step's cross cache (and so its logits) differ from encoder.onnx's."""
    folder = Path(shutil.copytree(shared_export(NAME)[0], tmp_path / "planted"))
    encoder = onnx.load(str(folder / "encoder.onnx"))
    decoder = onnx.load(str(folder / "decoder.onnx"))
    assert check_layout(open_export(folder)).passed
    # the cross projection: the MatMul of the memory (every layer's keys and values side by side)
    weight = next(node.input[1] for node in encoder.graph.node
                  if node.op_type == "MatMul" and node.input[0] == "last_hidden_state")
    key = next(t for t in encoder.graph.initializer if t.name == weight)
    key.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(key) * 2, key.name))
    onnx.save_model(layout_graphs(open_export(folder).card, encoder, decoder)[LAYOUT_DECODER],
                    str(folder / LAYOUT_DECODER))
    report = check_layout(open_export(folder, verify=False))
    assert not report.passed
    failed = {row.output for row in report.rows if not row.passed}
    assert "layout:present.*.encoder.*" in failed and "layout:last_hidden_state" not in failed


@on_shared(NAME)
@pytest.mark.parametrize("variant", ["optimize", "int8", "int8-dynamic"])
def test_the_variants_keep_the_layout(shared_export: SharedExport, variant: str) -> None:
    """Made from the optimized or quantized graphs, the layout computes what they compute;
    quantized, its graphs are stored under transformers.js's dtype names (docs/onnx-contract.md's
    table) and nothing quantized under the fp32 names."""
    folder, _ = shared_export(NAME, variant)
    assert check_layout(open_export(folder)).passed
    quantize = None if variant == "optimize" else variant
    encoder, decoder = (documented_stored_name(file, quantize)
                        for file in (LAYOUT_ENCODER, LAYOUT_DECODER))
    manifest = json.loads((folder / MANIFEST).read_text())
    assert list(manifest[LAYOUT]["graphs"]) == [encoder, decoder]
    assert {encoder, decoder} <= set(manifest["files"])
    if quantize:
        assert not (folder / LAYOUT_ENCODER).exists() and not (folder / LAYOUT_DECODER).exists()
        assert manifest["quantization"]["stored_as"] == {LAYOUT_ENCODER: encoder,
                                                         LAYOUT_DECODER: decoder}
    branches = {attribute.name: attribute.g for attribute
                in onnx.load(str(folder / decoder)).graph.node[0].attribute}
    ops = {node.op_type for node in branches["then_branch"].node}  # use_cache_branch: the
    # later steps' branch, decoder.onnx's own nodes
    decoder_ops = {node.op_type for node in onnx.load(str(folder / "decoder.onnx")).graph.node}
    assert decoder_ops <= ops | {"Constant"}
    if variant == "int8":
        assert "MatMulNBits" in ops
    encoder_ops = {node.op_type for node in onnx.load(str(folder / encoder)).graph.node}
    assert ("MatMulInteger" in encoder_ops) == (variant == "int8-dynamic")


@on_shared(NAME)
def test_a_folder_from_before_the_layout_runs_and_checks_as_before(shared_export: SharedExport,
                                                                   tmp_path: Path) -> None:
    folder = Path(shutil.copytree(shared_export(NAME)[0], tmp_path / "older"))
    manifest = json.loads((folder / MANIFEST).read_text())
    for file in manifest.pop(LAYOUT)["graphs"]:
        (folder / file).unlink()
        del manifest["files"][file]
    (folder / MANIFEST).write_text(json.dumps(manifest))
    for args in (["parity", str(folder)], ["run", str(folder), "--ids", "5,6,7"]):
        result = CliRunner().invoke(zoo, args)
        assert result.exit_code == 0, result.output
    assert "layout:" not in CliRunner().invoke(zoo, ["parity", str(folder)]).output


@ON_HF_CLIENTS
def test_a_translation_export_keeps_reading_its_sentencepiece_files(hf_client_exports: Lazy
                                                                    ) -> None:
    """tokenizer.json is the sentencepiece files' translation for transformers.js; `zoo run`
    reads the files themselves, as before, and tokenizer_config.json names MarianTokenizer."""
    folder = hf_client_exports[TRANSLATOR]
    assert (folder / "tokenizer.json").is_file() and (folder / "source.spm").is_file()
    assert isinstance(load_tokenizer(folder), SentencePieceTokenizer)
    config = json.loads((folder / "tokenizer_config.json").read_text())
    assert config["tokenizer_class"] == "MarianTokenizer"
    hf = json.loads((folder / "config.json").read_text())
    assert (hf["model_type"], hf["is_encoder_decoder"], hf["forced_eos_token_id"]) == (
        "marian", True, None)
