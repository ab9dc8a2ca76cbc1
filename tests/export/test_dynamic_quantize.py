"""`zoo export --quantize int8-dynamic`: the graph holds ONNX Runtime's dynamic-quantization
operators, its outputs stay within the gate of the fp32 export's (measured here with numpy, on
other rows than the gate's own), a broken quantization is refused by the gate, and the
families it is not for refuse it in one line."""

from __future__ import annotations

import hashlib
import json
import shutil
from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from click.testing import CliRunner
from onnx import numpy_helper

import export.onnx.dynamic
import export.onnx.variants
from cli import main
from runtime.contract import MANIFEST, MODEL_GRAPH
from tests.conftest import BERT_CLASSIFIER, SharedExport, on_shared, traces_reused
from tests.support.helpers import assert_refused_and_nothing_written

# Where transformers.js looks for dtype q8 (its DEFAULT_DTYPE_SUFFIX_MAPPING: "_quantized").
QUANTIZED_GRAPH = "onnx/model_quantized.onnx"
EMBEDDER = {"pooling": "mean"}  # bert-tiny keeps its MLM head: both figures are gated
SEED = 3
Exports = Callable[[str, bool], Path]


def sets(overrides: dict) -> list[str]:
    return [f"--set={key}={json.dumps(value)}" for key, value in overrides.items()]


def export_args(kind: str, quantized: bool) -> list[str]:
    overrides = EMBEDDER if kind == "embedder" else BERT_CLASSIFIER
    return (["export", "bert-tiny", "--onnx", "--seed", str(SEED), *sets(overrides)]
            + (["--quantize", "int8-dynamic"] if quantized else []))


@pytest.fixture(scope="module")
def exports(tmp_path_factory: pytest.TempPathFactory, shared_traces: dict) -> Exports:
    """(kind, quantized) -> folder: bert-tiny as an embedder or a classifier, fp32 or
    int8-dynamic, exported once by the command line (the fp32 trace reused for int8)."""
    root = tmp_path_factory.mktemp("dynamic")
    made: dict[tuple[str, bool], Path] = {}

    def get(kind: str, quantized: bool) -> Path:
        if (kind, quantized) not in made:
            out = root / f"{kind}-{'int8' if quantized else 'fp32'}"
            with traces_reused(shared_traces):
                result = CliRunner().invoke(main, [*export_args(kind, quantized), "-o", str(out)])
            assert result.exit_code == 0, result.output
            made[kind, quantized] = out
        return made[kind, quantized]

    return get


def graph(folder: Path) -> Path:
    """The folder's one graph: onnx/model.onnx, or quantized, transformers.js's q8 file."""
    return folder / (QUANTIZED_GRAPH if (folder / QUANTIZED_GRAPH).exists() else MODEL_GRAPH)


def run(folder: Path, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    session = ort.InferenceSession(str(graph(folder)), providers=["CPUExecutionProvider"])
    names = [output.name for output in session.get_outputs()]
    return dict(zip(names, session.run(None, feeds), strict=True))


def mixed_rows(rows: int = 24, seed: int = 11) -> dict[str, np.ndarray]:
    """Right-padded random byte ids (bert-tiny: 0-255 are bytes, 256 the pad), lengths 3-100."""
    rng = np.random.default_rng(seed)
    lengths = rng.integers(3, 101, rows)
    ids = np.full((rows, lengths.max()), 256, np.int64)
    mask = np.zeros_like(ids)
    for row, length in enumerate(lengths):
        ids[row, :length] = rng.integers(0, 256, length)
        mask[row, :length] = 1
    return {"input_ids": ids, "attention_mask": mask, "token_type_ids": np.zeros_like(ids)}


def cosine(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    a, b = a.astype(np.float64), b.astype(np.float64)
    return (a * b).sum(-1) / (np.linalg.norm(a, axis=-1) * np.linalg.norm(b, axis=-1))


def softmax(logits: np.ndarray) -> np.ndarray:
    shifted = np.exp(logits.astype(np.float64) - logits.max(-1, keepdims=True))
    return shifted / shifted.sum(-1, keepdims=True)


@pytest.mark.parametrize("kind", ["embedder", "classifier"])
def test_the_graph_holds_dynamic_quantization_and_every_weight_matmul_is_int8(
        kind: str, exports: Exports) -> None:
    fp32 = onnx.load(str(exports(kind, False) / MODEL_GRAPH))
    quantized = onnx.load(str(exports(kind, True) / QUANTIZED_GRAPH))
    ops = [node.op_type for node in quantized.graph.node]
    assert "MatMulInteger" in ops and "DynamicQuantizeLinear" in ops
    weights = {t.name for t in fp32.graph.initializer if len(t.dims) == 2}
    # Every fp32 MatMul or Gemm with a constant weight (or a transposed one: the tied MLM head) ...
    transposed = {n.output[0] for n in fp32.graph.node
                  if n.op_type == "Transpose" and n.input[0] in weights}
    expected = sum(n.op_type in ("MatMul", "Gemm")
                   and (n.input[1] in weights or n.input[1] in transposed)
                   for n in fp32.graph.node)  # (Gemm: the pooler's dense layer)
    # ... is a MatMulInteger on an int8 weight; no MatMul is left reading an fp32 constant.
    int8 = {t.name for t in quantized.graph.initializer if t.data_type == onnx.TensorProto.INT8}
    integer = [n for n in quantized.graph.node if n.op_type == "MatMulInteger"]
    assert len(integer) == expected > 0 and all(n.input[1] in int8 for n in integer)
    constants = {t.name for t in quantized.graph.initializer}
    assert not [n for n in quantized.graph.node
                if n.op_type == "MatMul" and n.input[1] in constants]
    # The feed-forward output projections (d_ff x d_model = 256 x 64, one a layer) read their
    # input divided by each row's largest magnitude (smoothing.py's per-token scales).
    rescaled = [n for n in quantized.graph.node if n.name.endswith("_rescale")]
    assert len(rescaled) == 2 and all(n.op_type == "Mul" for n in rescaled)


def test_an_embedder_keeps_its_vectors_and_mlm_predictions_within_the_gate(
        exports: Exports) -> None:
    feeds = mixed_rows()
    expected, actual = run(exports("embedder", False), feeds), run(exports("embedder", True), feeds)
    e, a = expected["sentence_embedding"], actual["sentence_embedding"]
    assert cosine(e, a).min() >= 0.99
    assert cosine(e - e.mean(0), a - e.mean(0)).min() >= 0.95
    assert not np.allclose(e, a, atol=1e-6)  # the int8 graph is really another computation
    real = feeds["attention_mask"].astype(bool)
    top1 = (expected["logits"][real].argmax(-1) == actual["logits"][real].argmax(-1)).mean()
    assert top1 >= 0.9


def test_a_classifier_keeps_its_labels_and_probabilities_within_the_gate(
        exports: Exports) -> None:
    feeds = mixed_rows()
    expected = softmax(run(exports("classifier", False), feeds)["logits"])
    actual = softmax(run(exports("classifier", True), feeds)["logits"])
    assert (expected.argmax(-1) == actual.argmax(-1)).mean() >= 0.9
    assert np.abs(expected - actual).max() <= 0.05


def test_the_manifest_and_zoo_parity_cover_the_quantized_file(exports: Exports) -> None:
    folder = exports("classifier", True)
    manifest = json.loads((folder / MANIFEST).read_text())
    # Only the q8 file: nothing quantized under the fp32 name, which transformers.js would
    # open for dtype fp32.
    assert sorted(p.relative_to(folder).as_posix() for p in folder.rglob("*.onnx")) == [
        QUANTIZED_GRAPH]
    assert list(manifest["graphs"]) == [QUANTIZED_GRAPH]
    entry = manifest["files"][QUANTIZED_GRAPH]
    assert entry["sha256"] == hashlib.sha256((folder / QUANTIZED_GRAPH).read_bytes()).hexdigest()
    assert json.loads((folder / "config.json").read_text())["transformers.js_config"] == {
        "dtype": "q8"}
    quantization = manifest["quantization"]
    assert quantization["weights"] == "int8-dynamic" and quantization["agreement"]["passed"]
    assert quantization["rewrites"]["files"][MODEL_GRAPH]["per_token_matmuls"] == 2
    figures = {check["figure"] for check in quantization["agreement"]["checks"]}
    assert figures == {"min cosine", "min centered cosine", "label agreement",
                       "max probability change"}
    result = CliRunner().invoke(main, ["parity", str(folder)])
    assert result.exit_code == 0, result.output
    assert "quality gate (int8-dynamic vs fp32): PASSED" in result.stdout
    # The file changed after the export: `zoo parity` refuses it before measuring anything.
    copy = folder.parent / "tampered"
    shutil.copytree(folder, copy)
    (copy / QUANTIZED_GRAPH).write_bytes((copy / QUANTIZED_GRAPH).read_bytes() + b"\0")
    tampered = CliRunner().invoke(main, ["parity", str(copy)])
    assert tampered.exit_code != 0 and "sha256" in tampered.output


def test_a_broken_quantization_is_refused_by_the_gate_with_its_figures(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, exports: Exports,
        shared_traces: dict) -> None:
    """Every int8 weight's entries shuffled (a layout mix-up): still MatMulInteger, still
    runs, but the vectors point elsewhere; the gate refuses it in one line, with the figure,
    and writes nothing."""
    exports("embedder", False)  # its trace is the one reused below
    real = export.onnx.variants.quantize_dynamic_graph
    rng = np.random.default_rng(0)

    def broken(model: onnx.ModelProto, *args: object) -> tuple[onnx.ModelProto, int, object]:
        quantized, count, report = real(model, *args)
        for tensor in quantized.graph.initializer:
            if tensor.data_type == onnx.TensorProto.INT8 and len(tensor.dims) == 2:
                weight = numpy_helper.to_array(tensor)
                shuffled = rng.permutation(weight.ravel()).reshape(weight.shape)
                tensor.CopyFrom(numpy_helper.from_array(shuffled, tensor.name))
        return quantized, count, report

    monkeypatch.setattr(export.onnx.variants, "quantize_dynamic_graph", broken)
    with traces_reused(shared_traces):
        assert_refused_and_nothing_written(export_args("embedder", True), tmp_path / "out",
                                           "int8-dynamic export below the quality gate: "
                                           "sentence_embedding, 16 rows min centered cosine")


def test_reduce_range_where_the_cpu_has_no_vnni(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, exports: Exports,
        shared_traces: dict) -> None:
    """Without VNNI the weights use 7 bits ([-64, 63]), so AVX2's 16-bit pair sums cannot
    saturate; with it, the full int8 range."""
    full = onnx.load(str(exports("embedder", True) / QUANTIZED_GRAPH))
    largest = max(np.abs(numpy_helper.to_array(t).astype(np.int16)).max()
                  for t in full.graph.initializer if t.data_type == onnx.TensorProto.INT8)
    if export.onnx.dynamic.has_vnni():
        assert largest > 64
    monkeypatch.setattr(export.onnx.dynamic, "has_vnni", lambda: False)
    out = tmp_path / "reduced"
    with traces_reused(shared_traces):
        result = CliRunner().invoke(main, [*export_args("embedder", True), "-o", str(out)])
    assert result.exit_code == 0, result.output
    assert json.loads((out / MANIFEST).read_text())["quantization"]["reduce_range"] is True
    reduced = onnx.load(str(out / QUANTIZED_GRAPH))
    weights = [numpy_helper.to_array(t) for t in reduced.graph.initializer
               if t.data_type == onnx.TensorProto.INT8]
    assert weights and all(-64 <= w.min() and w.max() <= 64 for w in weights)


def test_a_decoder_refuses_int8_dynamic_naming_the_alternative(tmp_path: Path) -> None:
    assert_refused_and_nothing_written(
        ["export", "gpt-tiny", "--onnx", "--quantize", "int8-dynamic"], tmp_path / "out",
        "use --quantize int8 (weight-only MatMulNBits)")


@on_shared("transformer-tiny")
def test_an_encoder_decoder_quantizes_its_encoder_only(shared_export: SharedExport) -> None:
    """The encoder runs once per source, compute-bound; the decoder's steps keep fp32 (the
    gate: generation agreement with the fp32 model)."""
    folder, report = shared_export("transformer-tiny", "int8-dynamic")
    ops = {file: {n.op_type for n in onnx.load(str(folder / file)).graph.node}
           for file in ("encoder.onnx", "decoder.onnx")}
    assert "MatMulInteger" in ops["encoder.onnx"] and "MatMulInteger" not in ops["decoder.onnx"]
    assert {row.figure for row in report.check.rows} == {"top-1 agreement", "in top-5"}
    assert report.check.passed and all(row.value >= 0.9 for row in report.check.rows)


def test_the_gate_reads_the_shipped_text_with_the_exports_tokenizer() -> None:
    """Real text where the export has a tokenizer (random ids were harsher on a real model
    than its use is), mixed lengths up to 64 tokens, right-padded with the mask."""
    from export.checks.quality import ROWS, mixed_batch
    from runtime.files.tokenizer import ByteTokenizer
    from tests.conftest import card
    from zoo.training.data import SHIPPED_TEXT

    feeds = mixed_batch(card("bert-tiny"), 0, ByteTokenizer())
    lengths = feeds["attention_mask"].sum(1)
    assert feeds["input_ids"].shape == (ROWS, 64) and lengths.min() == 4 and lengths.max() == 64
    first = [line for line in SHIPPED_TEXT.read_text().splitlines() if line.strip()][0]
    assert bytes(feeds["input_ids"][0, :4].tolist()) == first.encode()[:4]
    assert (feeds["input_ids"][feeds["attention_mask"] == 0] == 256).all()  # bert-tiny's pad
