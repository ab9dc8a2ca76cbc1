"""Serving outside the zoo (docs/serving.md): ONNX Runtime GenAI runs every decoder export with
its own loop and picks the tokens `zoo run` picks, reading the text through its own tokenizer;
every Triton config.pbtxt parses with Triton's own ModelConfig schema and describes exactly the
inputs and outputs of the ONNX graph beside it.

No Triton server runs here: the repository is checked against the schema and the graphs, and
each graph is loaded from its repository layout with ONNX Runtime."""

from __future__ import annotations

import importlib.util
import json
import re
import shutil
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from click.testing import CliRunner
from google.protobuf import text_format

import cli
from export.families import family_of
from export.onnx.writer import export_onnx
from export.opening import open_export
from export.options import ExportOptions
from export.targets.genai import GENAI_CONFIG, GENAI_GRAPH, genai_batch
from export.targets.tokenizer_files import byte_level_json
from export.targets.triton import TritonOptions, write_repository
from registry.errors import ZooError
from runtime.files.tokenizer import ByteTokenizer, load_tokenizer, tokenizer_files
from runtime.generate import generate
from tests.conftest import ON_TRAINED, Lazy, SharedExport, on_shared, traces_reused
from tests.support.genai import genai_greedy
from tests.support.greedy import until_eos
from zoo.files.importers import import_checkpoint
from zoo.files.sources import load_source
from zoo.training.data import SHIPPED_TEXT

og = pytest.importorskip("onnxruntime_genai")
tritonclient = pytest.importorskip("tritonclient")
transformers = pytest.importorskip("transformers")

NEW_TOKENS = 24
# The gpt-tiny exports here are this file's own (trained weights, a tokenizer), made in the
# worker of the trained-gpt-tiny group; the encoder and encoder-decoder ones are the session's
# shared exports, read by the tests marked on_shared (tests/conftest.py), which is the closer
# mark for them.
pytestmark = ON_TRAINED


def model_config_schema() -> ModuleType:
    """Triton's ModelConfig protobuf as the tritonclient package ships it. Loaded from its file:
    importing tritonclient.grpc would need grpcio, which nothing else here uses."""
    root = Path(importlib.util.find_spec("tritonclient").submodule_search_locations[0])
    spec = importlib.util.spec_from_file_location("triton_model_config_pb2",
                                                  root / "grpc" / "model_config_pb2.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def export_folder(source: Path, out: Path, optimize: bool = False,
                  quantize: str | None = None) -> Path:
    """An export without the parity grid (tests/export/test_export.py proves that): the reference
    here is the zoo's own generate() on the same files."""
    model, card = load_source(str(source))
    extra = tokenizer_files(source)
    export_onnx(model, card, out, family_of(card),
                ExportOptions(optimize=optimize, quantize=quantize), extra_files=extra)
    return out


# Only read (Triton configs of each family's graphs): the session's shared exports.
FROM_SHARED = ("bert-tiny", "transformer-tiny")


@pytest.fixture(scope="module")
def exports(tmp_path_factory: pytest.TempPathFactory, shared_export: SharedExport,
            shared_traces: dict, trained_gpt_tiny: Callable[[], Path]) -> Lazy:
    """Made on first use, so a worker running only the shared cards' tests trains nothing.
    The trained gpt-tiny's plain and --optimize exports share one trace of model.onnx (with
    tests/zoo/test_train.py's round trip too: the same trained folder, in the same worker)."""
    root = tmp_path_factory.mktemp("serving")

    def exported(source: Path, out: Path, optimize: bool = False,
                 quantize: str | None = None) -> Path:
        with traces_reused(shared_traces):
            return export_folder(source, out, optimize, quantize)

    def gpt2() -> Path:
        return import_checkpoint(hf_gpt2(root / "hf-gpt2"), root / "gpt2-imported") and \
            root / "gpt2-imported"

    own = {
        "gpt-tiny": lambda: exported(trained_gpt_tiny(), root / "gpt-tiny-onnx"),
        "gpt-tiny-optimized": lambda: exported(trained_gpt_tiny(), root / "gpt-tiny-opt",
                                               optimize=True),
        # stored as onnx/model_q4.onnx (transformers.js's q4 name), which genai_config names
        "gpt-tiny-int4": lambda: exported(trained_gpt_tiny(), root / "gpt-tiny-int4",
                                          quantize="int4"),
        "gpt2": lambda: export_folder(gpt2(), root / "gpt2-onnx"),
    }
    return Lazy([*own, *FROM_SHARED],
                lambda name: shared_export(name)[0] if name in FROM_SHARED else own[name]())


def hf_gpt2(folder: Path) -> Path:
    """A tiny random GPT-2 with a byte-level BPE tokenizer trained here (GPT-2's own kind)."""
    import torch
    from tokenizers import ByteLevelBPETokenizer

    tokenizer = ByteLevelBPETokenizer()
    text = SHIPPED_TEXT.read_text(encoding="utf-8")[:20000]
    tokenizer.train_from_iterator([text], vocab_size=320, special_tokens=["<|endoftext|>"])
    end = tokenizer.token_to_id("<|endoftext|>")
    torch.manual_seed(0)
    config = transformers.GPT2Config(n_layer=2, n_embd=32, n_head=4, n_positions=64,
                                     vocab_size=tokenizer.get_vocab_size(), bos_token_id=end,
                                     eos_token_id=end)
    model = transformers.GPT2LMHeadModel(config)
    with torch.no_grad():  # far from the 0.02 init, so greedy tokens vary
        for parameter in model.parameters():
            parameter.normal_(0.0, 0.3)
    model.eval().save_pretrained(folder, safe_serialization=True)
    tokenizer.save(str(folder / "tokenizer.json"))
    return folder


def zoo_greedy(folder: Path, prompts: list[list[int]], new_tokens: int) -> list[list[int]]:
    """What `zoo run --ids ... --ids ...` prints: the left-padded batch through generate()."""
    runtime = open_export(folder)
    card = runtime.card
    width = max(len(p) for p in prompts)
    ids = np.array([[card["pad_token_id"]] * (width - len(p)) + p for p in prompts], np.int64)
    mask = np.array([[0] * (width - len(p)) + [1] * len(p) for p in prompts], np.int64)
    rows = generate(runtime, ids, mask, new_tokens, eos=card["eos_token_id"])
    return [until_eos(row.tolist(), card["eos_token_id"]) for row in rows]


PROMPTS = {  # no prompt ends in the pad id: GenAI takes trailing pad ids for padding
    "gpt-tiny": [list(b"ROMEO:\nWhat"), list(b"Thou"), list(b"And then the king said")],
    "gpt-tiny-optimized": [list(b"ROMEO:\nWhat"), list(b"Thou"), list(b"And then the king")],
    "gpt-tiny-int4": [list(b"ROMEO:\nWhat"), list(b"Thou")],
    "gpt2": [[5, 17, 30, 2], [101, 7], [3, 250, 18, 44, 90, 12, 61]],
}


DISTINCT_ROWS = {"gpt-tiny", "gpt-tiny-optimized"}  # the random GPT-2 repeats one token


@pytest.mark.parametrize("name", list(PROMPTS))
def test_genai_picks_the_greedy_tokens_of_zoo_run(name: str, exports: Lazy) -> None:
    folder = exports[name]
    expected = zoo_greedy(folder, PROMPTS[name], NEW_TOKENS)
    if name in DISTINCT_ROWS:  # a real batch: padding wrong on either side would show
        assert len({tuple(row) for row in expected}) == len(expected)
    assert genai_greedy(folder, PROMPTS[name], NEW_TOKENS) == expected


@pytest.mark.parametrize("name", sorted(DISTINCT_ROWS))
def test_genai_batch_gives_each_row_what_its_prompt_gives_alone(name: str,
                                                                exports: Lazy) -> None:
    """On both graphs GenAI runs (the contract's; the shared-buffer GroupQueryAttention one),
    a batch fed as `genai_batch` feeds it gives each row GenAI's tokens for that prompt alone.
    Left-padded, GenAI reads the leading pad ids as tokens: every padded row changes (what
    benchmarks/batch.py once fed it; 15 of its 16 rows differed)."""
    folder, prompts = exports[name], PROMPTS[name]
    alone = [genai_greedy(folder, [prompt], NEW_TOKENS)[0] for prompt in prompts]
    assert len({tuple(row) for row in alone}) == len(alone)
    assert genai_greedy(folder, prompts, NEW_TOKENS) == alone
    left = genai_greedy(folder, prompts, NEW_TOKENS, left=True)
    width = max(map(len, prompts))
    assert [a == b for a, b in zip(left, alone, strict=True)] == [
        len(prompt) == width for prompt in prompts]


def test_genai_batch_pads_with_the_configs_pad_id_and_refuses_a_prompt_ending_in_it(
        tmp_path: Path) -> None:
    (tmp_path / GENAI_CONFIG).write_text(json.dumps({"model": {"pad_token_id": 9}}))
    assert genai_batch(tmp_path, [[5, 6, 7], [8]]).tolist() == [[5, 6, 7], [8, 9, 9]]
    with pytest.raises(ZooError, match="trailing pad id 9"):
        genai_batch(tmp_path, [[5, 6], [7, 9]])


def test_optimized_export_runs_the_shared_cache_graph_in_genai(exports: Lazy) -> None:
    config = json.loads((exports["gpt-tiny-optimized"] / GENAI_CONFIG).read_text())
    assert config["model"]["decoder"]["filename"] == GENAI_GRAPH
    assert config["search"]["past_present_share_buffer"] is True
    plain = json.loads((exports["gpt-tiny"] / GENAI_CONFIG).read_text())
    assert plain["model"]["decoder"]["filename"] == "onnx/model.onnx"
    assert plain["search"]["past_present_share_buffer"] is False
    manifest = json.loads((exports["gpt-tiny-optimized"] / "manifest.json").read_text())
    assert {GENAI_CONFIG, GENAI_GRAPH, "tokenizer.json"} <= set(manifest["files"])


@pytest.mark.parametrize("name, prompt", [("gpt-tiny", "ROMEO:\nWhat say"),
                                          ("gpt2", "First Citizen: we are")])
def test_genai_tokenizer_reads_and_writes_the_text_zoo_run_does(
        name: str, prompt: str, exports: Lazy) -> None:
    folder = exports[name]
    zoo_tokenizer = load_tokenizer(folder)  # the byte tokenizer, or tokenizers' tokenizer.json
    genai_tokenizer = og.Tokenizer(og.Model(str(folder)))
    ids = zoo_tokenizer.encode(prompt)
    assert genai_tokenizer.encode(prompt).tolist() == ids
    tokens = genai_greedy(folder, [ids], NEW_TOKENS)[0]
    assert tokens == zoo_greedy(folder, [ids], NEW_TOKENS)[0]
    text = genai_tokenizer.decode(np.array(tokens, np.int32))
    assert text and one_mark(text) == one_mark(zoo_tokenizer.decode(tokens))


def one_mark(text: str) -> str:
    """Bytes that are not UTF-8 (a barely trained model makes them) become U+FFFD on both
    sides; GenAI writes one per run, Python one per byte. That is the only difference."""
    return re.sub("\ufffd+", "\ufffd", text)


def test_byte_tokenizer_json_encodes_every_text_as_its_bytes() -> None:
    from tokenizers import Tokenizer

    hf = Tokenizer.from_str(byte_level_json(ByteTokenizer()))
    every_ascii = "".join(chr(c) for c in range(128))
    for text in [every_ascii, " two  spaces\tand\nlines ", "é日本語🎉", "\u0100\u07ff\uffff"]:
        ids = hf.encode(text, add_special_tokens=False).ids
        assert ids == ByteTokenizer().encode(text)
        assert hf.decode(ids) == text
    assert hf.decode([72, 257, 105, 258], skip_special_tokens=True) == "Hi"


# Triton


def onnx_tensors(values: list[onnx.ValueInfoProto]) -> list[tuple[str, str, list[int]]]:
    """(name, Triton dtype name, dims without the batch axis) as tritonclient names the dtype."""
    from tritonclient.utils import np_to_triton_dtype

    found = []
    for value in values:
        tensor = value.type.tensor_type
        dtype = np_to_triton_dtype(onnx.helper.tensor_dtype_to_np_dtype(tensor.elem_type))
        assert tensor.shape.dim[0].dim_param == "batch_size", value.name
        dims = [d.dim_value if d.dim_value else -1 for d in tensor.shape.dim[1:]]
        found.append((value.name, dtype, dims))
    return found


def config_tensors(entries: list, schema: ModuleType) -> list[tuple[str, str, list[int]]]:
    return [(e.name, schema.DataType.Name(e.data_type).removeprefix("TYPE_"), list(e.dims))
            for e in entries]


FAMILY_MODELS = {"gpt-tiny": ["gpt-tiny"], "gpt-tiny-optimized": ["gpt-tiny"],
                 "gpt-tiny-int4": ["gpt-tiny"],
                 "bert-tiny": ["bert-tiny"],
                 "transformer-tiny": ["transformer-tiny-decoder", "transformer-tiny-encoder"]}


@pytest.mark.parametrize("name", [
    pytest.param(name, marks=[on_shared(name)] if name in FROM_SHARED else [])
    for name in FAMILY_MODELS])
def test_triton_configs_parse_with_tritons_schema_and_match_the_graphs(
        name: str, exports: Lazy, tmp_path: Path) -> None:
    schema = model_config_schema()
    options = TritonOptions(max_batch_size=4, preferred_batch_sizes=(2, 4), kind="gpu",
                            instances=2)
    repository = tmp_path / "repo"
    written = write_repository(exports[name], repository, options)
    assert sorted(written) == FAMILY_MODELS[name] == sorted(p.name for p in repository.iterdir())
    manifest = json.loads((exports[name] / "manifest.json").read_text())
    graphs = dict(zip(sorted(written), sorted(manifest["graphs"]), strict=True))
    for model_name, graph_file in graphs.items():
        folder = repository / model_name
        config = text_format.Parse((folder / "config.pbtxt").read_text(), schema.ModelConfig())
        assert config.name == model_name and config.backend == "onnxruntime"
        assert config.max_batch_size == 4
        graph = onnx.load(str(exports[name] / graph_file), load_external_data=False)
        assert config_tensors(config.input, schema) == onnx_tensors(list(graph.graph.input))
        assert config_tensors(config.output, schema) == onnx_tensors(list(graph.graph.output))
        has_cache = any(i.name.startswith("past_key_values.") for i in graph.graph.input)
        assert config.HasField("dynamic_batching") != has_cache  # decoder steps: stateless
        if not has_cache:
            assert list(config.dynamic_batching.preferred_batch_size) == [2, 4]
        assert [(g.kind, g.count) for g in config.instance_group] == [
            (schema.ModelInstanceGroup.KIND_GPU, 2)]
        # The layout the ONNX Runtime backend loads: model.onnx, or with external data a
        # folder model.onnx/ holding model.onnx and the data; ORT opens it from there.
        placed = folder / "1" / "model.onnx"
        external = any(exports[name].rglob("weights.onnx.data"))
        assert placed.is_dir() == external
        graph_path = placed / "model.onnx" if external else placed
        session = ort.InferenceSession(str(graph_path), providers=["CPUExecutionProvider"])
        assert [i.name for i in session.get_inputs()] == [e.name for e in config.input]
    # The repository holds copies: a hard-linked data file would make onnx.checker refuse the
    # export itself ("multiple hard links, a potential hardlink attack"), and the other tests
    # reading this shared export with it.
    for path in exports[name].rglob("*.onnx*"):
        assert path.stat().st_nlink == 1, path
    for graph_file in manifest["graphs"]:
        onnx.checker.check_model(str(exports[name] / graph_file))


@on_shared("bert-tiny")
def test_zoo_triton_command_refuses_existing_and_bad_options(exports: Lazy,
                                                             tmp_path: Path) -> None:
    runner = CliRunner()
    folder, repository = str(exports["bert-tiny"]), str(tmp_path / "repo")
    done = runner.invoke(cli.main, ["triton", folder, "-o", repository, "--kind", "cpu"])
    assert done.exit_code == 0, done.output
    assert "tritonserver --model-repository=" in done.output
    again = runner.invoke(cli.main, ["triton", folder, "-o", repository])
    assert again.exit_code == 2 and "already exists" in again.output
    bad = runner.invoke(cli.main, ["triton", folder, "-o", str(tmp_path / "b"),
                                   "--max-batch-size", "0"])
    assert bad.exit_code == 2 and "--max-batch-size 0" in bad.output
    assert not (tmp_path / "b").exists()
    shutil.rmtree(repository)
