"""`zoo export --dtype fp16` and `--quantize int4 --dtype fp16` (q4f16), issue #49.

The float32 islands (export/onnx/precision.py) are tested on one-purpose graphs against numpy
in float32: rotary angles past position 1,000, a fully masked softmax row, an RMS norm whose
squares overflow float16. The exports are tested against PyTorch run in float16 by the parity
check the export itself passes (export/checks/half.py), and their files, names and configs as
the clients read them.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
from click.testing import CliRunner
from onnx import TensorProto, helper, numpy_helper

from cli import main
from export.checks.half import check_float16, float16_step, half_copy, tolerances
from export.onnx.precision import FP16_MAX, PrecisionError, float16_plan, to_float16
from export.opening import open_export, open_model
from runtime.contract import MODEL_GRAPH
from runtime.sessions import Graph, cuda_active
from tests.conftest import card, on_shared
from zoo import GenerateOptions, load
from zoo.assemble import build_model
from zoo.files.weights import load_built, save_built

CPU = ["CPUExecutionProvider"]


def run_graph(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    return ort.InferenceSession(model.SerializeToString(), providers=CPU).run(None, feeds)


def make_model(nodes: list, inputs: list, outputs: list, initializers: list) -> onnx.ModelProto:
    graph = helper.make_graph(nodes, "g", inputs, outputs, initializers)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    model.ir_version = 10
    return model


def rotary_graph(frequency: float) -> onnx.ModelProto:
    """y = x * cos(position * frequency): the angle from the position ids alone."""
    return make_model(
        [helper.make_node("Cast", ["position_ids"], ["p"], to=TensorProto.FLOAT),
         helper.make_node("Mul", ["p", "inv_freq"], ["angle"]),
         helper.make_node("Cos", ["angle"], ["cos"]),
         helper.make_node("Mul", ["x", "cos"], ["y"])],
        [helper.make_tensor_value_info("position_ids", TensorProto.INT64, [1, "T"]),
         helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, "T"])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, "T"])],
        [numpy_helper.from_array(np.array([frequency], np.float32), "inv_freq")])


def test_rotary_angles_past_position_1000_stay_float32() -> None:
    """At angles near 370 float16's spacing is 0.25 rad: computed in float16, cos is off by up
    to 0.25; kept float32 (and cast once), it is float16's rounding of numpy's float32 cos."""
    frequency = 0.37
    positions = np.arange(1000, 1032, dtype=np.int64)[None]
    x = np.ones((1, 32), np.float32)
    model, plan = to_float16(rotary_graph(frequency), "rotary")
    assert len(plan.positions_and_masks) == 3  # Cast, Mul, Cos
    (got,) = run_graph(model, {"position_ids": positions, "x": x.astype(np.float16)})
    expected = np.cos(positions.astype(np.float32) * np.float32(frequency)).astype(np.float16)
    assert got.dtype == np.float16
    np.testing.assert_array_equal(got, expected)


def masked_softmax_graph() -> onnx.ModelProto:
    """softmax(scores + mask), the mask the lowest float32 where attention_mask is 0."""
    return make_model(
        [helper.make_node("Cast", ["attention_mask"], ["allowed"], to=TensorProto.BOOL),
         helper.make_node("Where", ["allowed", "zero", "lowest"], ["mask"]),
         helper.make_node("Add", ["scores", "mask"], ["masked"]),
         helper.make_node("Softmax", ["masked"], ["probabilities"], axis=-1)],
        [helper.make_tensor_value_info("scores", TensorProto.FLOAT, ["B", 4]),
         helper.make_tensor_value_info("attention_mask", TensorProto.INT64, ["B", 4])],
        [helper.make_tensor_value_info("probabilities", TensorProto.FLOAT, ["B", 4])],
        [numpy_helper.from_array(np.array(0, np.float32), "zero"),
         numpy_helper.from_array(np.array(np.finfo(np.float32).min, np.float32), "lowest")])


def test_a_fully_masked_row_is_uniform_as_in_float32() -> None:
    """A padding query sees no key: float32's lowest value keeps the row uniform (the contract
    graphs' behaviour); clamped to float16's -65504, scores below -16 overflow to -inf and the
    row would be NaN or follow the masked scores."""
    model, plan = to_float16(masked_softmax_graph(), "softmax")
    assert plan.softmax  # the Add of the mask and the Softmax
    scores = np.array([[-40.0, 3.0, -20.0, 1.0], [0.5, -30.0, 2.0, 1.0]], np.float16)
    mask = np.array([[0, 0, 0, 0], [1, 0, 1, 1]], np.int64)
    (got,) = run_graph(model, {"scores": scores, "attention_mask": mask})
    wide = scores.astype(np.float32) + np.where(mask == 1, 0, np.finfo(np.float32).min)
    expected = np.exp(wide - wide.max(-1, keepdims=True))
    expected /= expected.sum(-1, keepdims=True)
    assert np.isfinite(got).all()
    np.testing.assert_allclose(got.astype(np.float32), expected, atol=float16_step(1.0))


def rms_norm_graph(size: int) -> onnx.ModelProto:
    """x / sqrt(mean(x^2) + eps) * w, the form the zoo's RMSNorm exports."""
    return make_model(
        [helper.make_node("Pow", ["x", "two"], ["square"]),
         helper.make_node("ReduceMean", ["square", "axes"], ["mean"], keepdims=1),
         helper.make_node("Add", ["mean", "eps"], ["shifted"]),
         helper.make_node("Sqrt", ["shifted"], ["rms"]),
         helper.make_node("Div", ["x", "rms"], ["normed"]),
         helper.make_node("Mul", ["normed", "weight"], ["y"])],
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["T", size])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["T", size])],
        [numpy_helper.from_array(np.array(2, np.float32), "two"),
         numpy_helper.from_array(np.array([-1], np.int64), "axes"),
         numpy_helper.from_array(np.array(1e-6, np.float32), "eps"),
         numpy_helper.from_array(np.linspace(0.5, 1.5, size, dtype=np.float32), "weight")])


def test_an_rms_norm_of_large_activations_is_finite() -> None:
    """Activations near 1,000 (real models' residual streams reach that): x^2 overflows
    float16; the norm's reductions in float32 give numpy's float32 result."""
    size = 16
    model, plan = to_float16(rms_norm_graph(size), "norm")
    assert len(plan.norms) == 5  # Pow, ReduceMean, Add, Sqrt, Div; the weight's Mul is fp16
    x = np.random.default_rng(0).uniform(600, 1200, (3, size)).astype(np.float16)
    (got,) = run_graph(model, {"x": x})
    wide = x.astype(np.float32)
    normed = (wide / np.sqrt((wide ** 2).mean(-1, keepdims=True) + 1e-6)).astype(np.float16)
    expected = normed * np.linspace(0.5, 1.5, size, dtype=np.float32).astype(np.float16)
    np.testing.assert_allclose(got.astype(np.float32), expected.astype(np.float32),
                               atol=float16_step(1.5))


def test_the_plan_names_positions_not_weights() -> None:
    """A bias times a scale (a constant-only computation) is a weight, float16; the position
    nodes and the constants only they read stay float32."""
    model = rotary_graph(0.5)
    model.graph.node.extend([helper.make_node("Mul", ["bias", "scale"], ["scaled"]),
                             helper.make_node("Add", ["y", "scaled"], ["z"])])
    model.graph.initializer.extend([numpy_helper.from_array(np.ones(1, np.float32), "bias"),
                                    numpy_helper.from_array(np.array(2, np.float32), "scale")])
    model.graph.output[0].name = "z"
    plan = float16_plan(model.graph)
    kinds = {node.name: node.op_type for node in model.graph.node}
    assert sorted(kinds[name] for name in plan.positions_and_masks) == ["Cast", "Cos", "Mul"]


def test_a_weight_float16_cannot_hold_is_refused_by_name() -> None:
    model = rms_norm_graph(4)
    model.graph.initializer[-1].CopyFrom(numpy_helper.from_array(
        np.array([1.0, 1e5, 1.0, 1.0], np.float32), "weight"))
    with pytest.raises(PrecisionError, match=r"norm: --dtype fp16: weight weight holds 1e\+05"):
        to_float16(model, "norm")


def test_the_tolerance_is_derived_from_pytorchs_own_float16_error() -> None:
    wide = np.array([0.25, -3.0, 1.5])
    narrow = wide + np.array([1e-3, 0.0, -2e-3])
    step = 2 ** -9  # float16's spacing at 3 (2^1 * 2^-10)
    assert tolerances(wide, narrow) == pytest.approx((2 * 2e-3 + step, 3 * 2e-3 + step))
    assert float16_step(FP16_MAX) == 32.0  # float16's largest binade


def test_bf16_is_refused_naming_the_provider_that_lacks_it(tmp_path: Path) -> None:
    """ONNX Runtime's CPU provider has no bfloat16 MatMul (asked here, not assumed)."""
    matmul = make_model([helper.make_node("MatMul", ["a", "b"], ["c"])],
                        [helper.make_tensor_value_info(n, TensorProto.BFLOAT16, [2, 2])
                         for n in "ab"],
                        [helper.make_tensor_value_info("c", TensorProto.BFLOAT16, [2, 2])], [])
    with pytest.raises(Exception, match="NOT_IMPLEMENTED"):
        run_graph(matmul, {})
    result = CliRunner().invoke(main, ["export", "gpt-tiny", "--onnx", "-o",
                                       str(tmp_path / "out"), "--dtype", "bf16"])
    assert result.exit_code != 0
    assert "CPU provider" in result.output and "bfloat16" in result.output
    assert result.output.count("error:") == 1 and "Traceback" not in result.output
    assert "loading" not in result.output  # refused before the model is built
    assert not (tmp_path / "out").exists()


def test_int8_with_fp16_is_refused_in_one_line(tmp_path: Path) -> None:
    result = CliRunner().invoke(main, ["export", "gpt-tiny", "--onnx", "-o",
                                       str(tmp_path / "out"), "--dtype", "fp16",
                                       "--quantize", "int8"])
    assert result.exit_code != 0 and "q4f16" in result.output
    assert not (tmp_path / "out").exists()


def test_an_overflowing_weight_refuses_the_export_and_writes_nothing(tmp_path: Path) -> None:
    """A planted 1e5 in a built model: `zoo export --dtype fp16` names the tensor, exits
    non-zero, and leaves no folder (not a file of infinities)."""
    tiny = card("gpt-tiny")
    model = build_model(tiny, seed=0)
    name, weight = next((n, p) for n, p in model.named_parameters() if p.ndim == 2
                        and n == "layers.1.feed_forward.up.weight")
    with torch.no_grad():
        weight[0, 0] = 1e5
    built = tmp_path / "built"
    save_built(model, tiny, built)
    out = tmp_path / "out"
    result = CliRunner().invoke(main, ["export", str(built), "--onnx", "-o", str(out),
                                       "--dtype", "fp16"])
    assert result.exit_code != 0, result.output
    assert name in result.output and "65504" in result.output, result.output
    assert not out.exists()


def cards(default: list[str], slow: list[str]) -> list:
    """Tiny cards for a test: `default` in `make test`, `slow` in `make test-slow`."""
    return [*map(pytest.param, default),
            *(pytest.param(name, marks=pytest.mark.slow) for name in slow)]


# Every tiny family, plain: the default run keeps a decoder with rotary (llama), the paper's
# encoder-decoder (its seq2seq layout in float16 too) and an encoder; the rest run slow.
FAMILIES = cards(["llama-tiny", "transformer-tiny", "bert-tiny"],
                 ["gpt-tiny", "gemma-tiny", "moe-tiny", "t5-tiny"])


@on_shared("shared")
@pytest.mark.parametrize("name", FAMILIES)
def test_fp16_export_passes_parity_against_pytorch_float16(name: str, shared_export) -> None:
    folder, report = shared_export(name, "fp16")
    assert report.passed
    # every row of the grid carries its derived tolerance (the seq2seq layout's rows compare
    # the layout with the export's own float16 graphs, at the fp32 tolerances)
    assert [row for row in report.check.rows if row.tolerance is not None]
    manifest = json.loads((folder / "manifest.json").read_text())
    assert manifest["precision"]["dtype"] == "fp16"
    for file in manifest["graphs"]:
        inputs = {i.name: i.type.tensor_type.elem_type for i in onnx.load(
            str(folder / file), load_external_data=False).graph.input}
        assert TensorProto.FLOAT not in inputs.values(), (file, inputs)  # cache in float16


@on_shared("shared")
@pytest.mark.parametrize("name", cards(["llama-tiny"], ["gpt-tiny", "moe-tiny", "gemma-tiny"]))
def test_optimized_fp16_runs_the_shared_cache_loop_in_float16(name: str, shared_export) -> None:
    folder, report = shared_export(name, "optimize-fp16")
    assert report.passed
    generation = [what for what, _, _ in report.check.generation]
    assert any("shared-cache" in what for what in generation)
    runtime = open_export(folder)
    assert runtime.kv_graph is not None
    assert runtime.kv_graph.inputs["past_key_values.0.key"].type == "tensor(float16)"


@on_shared("shared")
@pytest.mark.parametrize("name", cards(["gpt-tiny"], ["llama-tiny", "bert-tiny", "t5-tiny",
                                                     "transformer-tiny"]))
def test_q4f16_export_is_4_bit_weights_with_float16_scales(name: str, shared_export) -> None:
    folder, report = shared_export(name, "q4f16")
    assert report.passed
    manifest = json.loads((folder / "manifest.json").read_text())
    assert manifest["quantization"]["weights"] == "int4"
    assert manifest["precision"]["dtype"] == "fp16"
    for file in manifest["graphs"]:
        graph = onnx.load(str(folder / file), load_external_data=False).graph
        nbits = [node for node in graph.node if node.op_type == "MatMulNBits"]
        assert nbits, file
        scales = {t.name: t.data_type for t in graph.initializer}
        assert {scales[node.input[2]] for node in nbits} == {TensorProto.FLOAT16}


@on_shared("gpt-tiny")
def test_files_and_configs_name_the_float16_graphs(shared_export) -> None:
    for variant, stored, dtype in (("fp16", "onnx/model_fp16.onnx", "fp16"),
                                   ("q4f16", "onnx/model_q4f16.onnx", "q4f16")):
        folder, _ = shared_export("gpt-tiny", variant)
        assert sorted(p.name for p in (folder / "onnx").iterdir()) == [Path(stored).name]
        config = json.loads((folder / "config.json").read_text())
        assert config["transformers.js_config"]["dtype"] == dtype
        assert config["torch_dtype"] == "float16"
        genai = json.loads((folder / "genai_config.json").read_text())
        assert genai["model"]["decoder"]["filename"] == stored
        manifest = json.loads((folder / "manifest.json").read_text())
        assert stored in manifest["graphs"]


@on_shared("gpt-tiny")
def test_fp16_files_are_about_half_of_fp32s(shared_export) -> None:
    """gpt-tiny's learned position table stays float32 (it is read by position ids alone):
    the rest halves."""
    def size(variant: str) -> int:
        folder, _ = shared_export("gpt-tiny", variant)
        return sum(p.stat().st_size for p in (folder / "onnx").iterdir())

    assert size("fp16") < 0.6 * size("plain")


@on_shared("llama-tiny")
def test_zoo_load_generates_with_the_float16_cache(shared_export) -> None:
    """The runtime feeds a float16 graph's cache back as float16 and hands float32 logits to
    the sampler; greedy tokens are PyTorch float16's, teacher-forced (the export's check)."""
    folder, _ = shared_export("llama-tiny", "fp16")
    exported = load(folder)
    generated = exported.generate([[5, 6, 7]], GenerateOptions(max_new_tokens=6))[0]
    assert len(generated.ids) == 6
    graph = Graph(folder / "onnx/model_fp16.onnx", "cpu")
    feeds = {"input_ids": np.array([[5, 6]]), "attention_mask": np.ones((1, 2), np.int64),
             "position_ids": np.array([[0, 1]]),
             **{name: np.zeros((1, 2, 0, 16), np.float32) for name in graph.inputs
                if name.startswith("past_")}}
    outputs = graph.run(feeds)
    assert outputs["logits"].dtype == np.float32
    assert outputs["present.0.key"].dtype == np.float16
    model = half_copy(build_model(card("llama-tiny"), seed=1))
    with torch.no_grad():
        expected = model(torch.tensor([[5, 6]]))[0].float().numpy()
    assert np.abs(outputs["logits"] - expected).max() < 8 * float16_step(1.0)


def test_fp16_with_attention_maps(tmp_path: Path) -> None:
    """The attention maps are a softmax's output (float32 inside) and a graph output (float16):
    one value cast twice, once for the graph and once for the values' MatMul."""
    result = CliRunner().invoke(main, ["export", "gpt-tiny", "--onnx", "-o", str(tmp_path / "a"),
                                       "--dtype", "fp16", "--attentions"])
    assert result.exit_code == 0, result.output
    assert "attentions.*" in result.output and "parity: PASSED" in result.output


def test_a_half_copy_keeps_rotary_frequencies_float32() -> None:
    model = half_copy(build_model(card("llama-tiny"), seed=0))
    buffers = dict(model.named_buffers())
    assert {b.dtype for n, b in buffers.items() if n.endswith("inv_freq")} == {torch.float32}
    assert {p.dtype for p in model.parameters()} == {torch.float16}


@on_shared("gpt-tiny")
def test_a_float16_graph_off_by_a_few_steps_fails_parity(tmp_path: Path, shared_export) -> None:
    """`zoo parity` on a copy of the fp16 export whose logits carry a planted offset of four
    float16 steps: the derived tolerance (about one step plus PyTorch's own error) rejects
    it."""
    from export.checks.parity import ParityError
    from export.checks.verify import verify

    folder, _ = shared_export("gpt-tiny", "fp16")
    copy = tmp_path / "copy"
    shutil.copytree(folder, copy)
    path = copy / "onnx/model_fp16.onnx"
    model = onnx.load(str(path))
    graph = model.graph
    for node in graph.node:
        node.output[:] = ["logits/raw" if o == "logits" else o for o in node.output]
    graph.initializer.append(numpy_helper.from_array(np.array(4 * 2 ** -10, np.float16),
                                                     "planted"))
    graph.node.append(helper.make_node("Add", ["logits/raw", "planted"], ["logits"]))
    onnx.save(model, str(path))
    runtime = open_export(copy, verify=False)  # the planted file is not the manifest's
    built = build_model(card("gpt-tiny"), seed=1)
    with pytest.raises(ParityError):
        verify(built, card("gpt-tiny"), runtime)
    assert MODEL_GRAPH in runtime.graphs


@pytest.mark.slow
def test_smollm2_fp16_and_q4f16_sizes_and_greedy_tokens(tmp_path: Path) -> None:
    """SmolLM2-135M-Instruct (the packaged GGUF, dequantized), every export `--optimize`:
    onnx/ in fp16 at most 0.52x fp32's and q4f16 smaller than int4's; `zoo run`'s greedy tokens
    from the fp16 export are PyTorch float16's (the whole sequence re-run each step). About 12
    minutes on 2 cores."""
    from runtime.files.tokenizer import load_tokenizer
    from tests.conftest import packaged_smollm2
    from zoo.files.weights import load_built

    def zoo_ok(*args: object) -> str:
        result = CliRunner().invoke(main, [str(arg) for arg in args])
        assert result.exit_code == 0, result.output
        return result.output

    smol = tmp_path / "smol"
    zoo_ok("import", packaged_smollm2(), "-o", smol)
    sizes = {}
    for name, extra in {"fp32": [], "fp16": ["--dtype", "fp16"], "int4": ["--quantize", "int4"],
                        "q4f16": ["--quantize", "int4", "--dtype", "fp16"]}.items():
        zoo_ok("export", smol, "--onnx", "--optimize", *extra, "-o", tmp_path / name)
        sizes[name] = sum(p.stat().st_size for p in (tmp_path / name / "onnx").iterdir())
    assert sizes["fp16"] <= 0.52 * sizes["fp32"], sizes
    assert sizes["q4f16"] < sizes["int4"], sizes
    prompt = load_tokenizer(smol).encode("The capital of France is Paris, and the capital of")
    got = zoo_ok("run", tmp_path / "fp16", "--ids", ",".join(map(str, prompt)),
                 "--max-new-tokens", "24")
    model, _ = load_built(smol)
    ids = torch.tensor([prompt])
    half = half_copy(model)
    with torch.no_grad():
        for _ in range(24):
            ids = torch.cat([ids, half(ids)[0][:, -1].float().argmax(-1, keepdim=True)], dim=1)
    assert got.strip().splitlines()[-1] == ",".join(map(str, ids[0, len(prompt):].tolist()))


@on_shared("llama-tiny")
def test_zoo_serve_answers_from_float16_exports_as_zoo_run(tmp_path: Path,
                                                           shared_export) -> None:
    """The plain loop and the shared-cache loop (GroupQueryAttention in float16) behind
    `zoo serve`, each answering what `zoo run` prints for the same folder."""
    from tests.support.serve import KEY, Server, with_tokenizer, zoo_run

    folders = {name: with_tokenizer(shared_export("llama-tiny", variant)[0], tmp_path / name)
               for name, variant in (("plain", "fp16"), ("kv", "optimize-fp16"))}
    server = Server(list(folders.values()), tmp_path / "serve.log", "--api-key", KEY)
    try:
        for name, folder in folders.items():
            expected = zoo_run(folder, "--text", "w5 w6", "--max-new-tokens", "7")
            status, body = server.request("/v1/completions", {
                "model": name, "prompt": "w5 w6", "max_tokens": 7, "temperature": 0})
            assert status == 200, body
            assert "w5 w6" + body["choices"][0]["text"] == expected, name
    finally:
        assert server.stop() == 0



def test_contrib_outputs_are_typed_without_files_in_the_working_folder(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """MatMulNBits (an ONNX Runtime contrib operator, which onnx's inference cannot type) then
    an Add: the q4f16 form, in float16 within a few float16 steps of the float32 int4 graph,
    and nothing written where it runs (ONNX Runtime's symbolic inference, used before, left
    sym_shape_infer_temp.onnx and its data there on the graphs it gave up on: moe-tiny's
    int4 shared-cache graph)."""
    from export.onnx.quantize import quantize

    weight = np.random.default_rng(0).normal(size=(64, 16)).astype(np.float32)
    model = make_model([helper.make_node("MatMul", ["x", "w"], ["h"]),
                        helper.make_node("Add", ["h", "b"], ["y"])],
                       [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["T", 64])],
                       [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["T", 16])],
                       [numpy_helper.from_array(weight, "w"),
                        numpy_helper.from_array(np.ones(16, np.float32), "b")])
    quantized, _ = quantize(model, "int4", 0)
    x = np.random.default_rng(1).normal(size=(3, 64)).astype(np.float16)
    (expected,) = run_graph(quantized, {"x": x.astype(np.float32)})  # the same int4, float32
    monkeypatch.chdir(tmp_path)
    converted, _ = to_float16(quantized, "nbits")
    assert list(tmp_path.iterdir()) == []
    (got,) = run_graph(converted, {"x": x})
    assert got.dtype == np.float16
    # float16 scales, sums and output: a few float16 steps at the outputs' magnitude
    np.testing.assert_allclose(got.astype(np.float32), expected,
                               atol=4 * float16_step(float(np.abs(expected).max())))


@pytest.mark.skipif(not cuda_active(), reason="ONNX Runtime's CUDA provider is not active")
@pytest.mark.parametrize("name", [pytest.param(name, marks=on_shared(name))
                                  for name in ("gpt-tiny", "llama-tiny")])
def test_float16_exports_pass_their_check_on_cuda(name: str, shared_export: object) -> None:
    """What a GPU runs fp16 exports on (../shared/GPU.md step 3): the export made and checked
    here on the CPU, opened on ONNX Runtime's CUDA provider, passes the same float16 check
    against PyTorch in float16 and float32."""
    folder, _ = shared_export(name, "fp16")  # type: ignore[operator]
    cuda = open_export(folder, "cuda")
    for graph in cuda.graphs.values():
        assert graph.session.get_providers()[0] == "CUDAExecutionProvider"
    model, built = load_built(folder)
    assert check_float16(model, open_model(model, built), cuda).passed
