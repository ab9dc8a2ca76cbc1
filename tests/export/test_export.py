"""ONNX export and ONNX Runtime: contract, parity grid, generation, metadata, bad input."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import numpy as np
import onnx
import pytest
import yaml
from click.testing import CliRunner
from onnx import numpy_helper

from cli import main
from export.checks.parity import check_parity
from export.families import family_of
from export.onnx.trace import TRACE_SIZES
from export.opening import open_export, open_model
from export.pipeline import export_and_verify
from export.torch_engine import TorchEngine
from runtime.contract import MANIFEST
from runtime.files.atomic import sha256
from runtime.generate import generate, open_session
from runtime.manifest import ManifestError, read_manifest
from runtime.sampling import Sampling
from runtime.sessions import OrtError, Runtime, cuda_active
from tests.conftest import (
    TINY_CARDS,
    Lazy,
    SharedExport,
    assert_weights_stored_once,
    card,
    on_shared,
)
from tests.support.contract_doc import documented_contract
from tests.support.helpers import assert_error_after_progress
from zoo.assemble import build_model
from zoo.files.weights import WEIGHTS, load_built

# The tests that read the session's shared exports run in their card's pytest-xdist group, so
# each export is made once (tests/conftest.py: shared_export, on_shared).
pytestmark = on_shared("gpt-tiny")

CUDA = cuda_active()
GPT_TINY = card("gpt-tiny").fields
needs_cuda = pytest.mark.skipif(not CUDA, reason="ONNX Runtime's CUDA provider is not active")


@pytest.fixture(scope="module")
def exported(shared_export: SharedExport) -> Lazy:
    """Each tiny card's plain export (made once per session; export runs the parity check)."""
    return Lazy(TINY_CARDS, lambda name: shared_export(name)[0])


def copy_export(source: Path, tmp_path: Path) -> Path:
    target = tmp_path / source.name
    shutil.copytree(source, target)
    return target


def engines(folder: Path) -> tuple[TorchEngine, Runtime]:
    model, loaded = load_built(folder)
    return open_model(model, loaded), open_export(folder)


def past_shape(fields: dict, heads: int | None = None) -> tuple[int, int, int, int]:
    """An empty cache for one layer, batch 1, from the card: (1, key/value heads, 0,
    d_model / n_heads)."""
    heads = (fields["n_kv_heads"] or fields["n_heads"]) if heads is None else heads
    return (1, heads, 0, fields["d_model"] // fields["n_heads"])


def empty_past_feeds(fields: dict) -> dict[str, np.ndarray]:
    return {f"past_key_values.{i}.{kind}": np.zeros(past_shape(fields), np.float32)
            for i in range(fields["n_layers"]) for kind in ("key", "value")}


@pytest.mark.parametrize("name", TINY_CARDS)
def test_every_tiny_card_exports_checks_and_passes_the_grid(name: str,
                                                            exported: Lazy) -> None:
    folder = exported[name]
    for file in documented_contract(card(name)):
        onnx.checker.check_model(str(folder / file), full_check=True)
    report = check_parity(*engines(folder))
    assert report.passed, report.table()
    cases = {row.case for row in report.rows}
    assert any("s1 " in c or c.endswith("s1") for c in cases)
    assert any("padded" in c for c in cases)
    if card(name).family != "encoder":
        assert any("past0" in c for c in cases)
        assert any("past" in c and "past0" not in c for c in cases)
        assert report.generation and all(same for _, same, _ in report.generation)


@pytest.mark.parametrize("name", [n for n in TINY_CARDS if card(n).family != "encoder"])
def test_the_manifest_records_the_cache_shape_the_graphs_take(name: str, exported: Lazy) -> None:
    """What other runtimes make an empty past from: the graph's own cache input dims, and the
    card's key/value heads and d_model / n_heads."""
    tiny = card(name)
    manifest = json.loads((exported[name] / MANIFEST).read_text())
    heads, head_dim = tiny["n_heads"], tiny["d_model"] // tiny["n_heads"]
    kv_heads = tiny["n_kv_heads"] or heads  # grouped-query attention: the cache's heads
    shape = ["batch_size", kv_heads, "past_sequence_length", head_dim]
    assert manifest["cache"] == {"heads": heads, "kv_heads": kv_heads, "head_dim": head_dim,
                                 "shape": shape}
    for file in manifest["graphs"]:
        graph = onnx.load(str(exported[name] / file), load_external_data=False).graph
        for value in graph.input:
            if value.name.startswith("past_key_values.") and ".encoder." not in value.name:
                dims = value.type.tensor_type.shape.dim
                assert [d.dim_param or d.dim_value for d in dims] == manifest["cache"]["shape"]


@pytest.mark.parametrize("name", TINY_CARDS)
def test_inputs_and_outputs_follow_the_contract_with_dynamic_axes(
        name: str, exported: Lazy) -> None:
    for file, (inputs, outputs) in documented_contract(card(name)).items():
        model = onnx.load(str(exported[name] / file), load_external_data=False)
        assert [i.name for i in model.graph.input] == inputs
        assert [o.name for o in model.graph.output] == outputs
        for value in model.graph.input:
            dims = value.type.tensor_type.shape.dim
            assert dims[0].dim_param, f"{file}:{value.name} batch axis is fixed"
            if value.name in ("input_ids", "attention_mask") or "past" in value.name:
                axis = 2 if "past" in value.name else 1
                assert dims[axis].dim_param, f"{file}:{value.name} axis {axis} is fixed"
            if value.type.tensor_type.elem_type != onnx.TensorProto.FLOAT:
                assert value.type.tensor_type.elem_type == onnx.TensorProto.INT64


@pytest.mark.parametrize("name", ["gpt-tiny", "transformer-tiny"])
def test_greedy_tokens_identical_and_batched_padding_equals_one_at_a_time(
        name: str, exported: Lazy) -> None:
    torch_engine, ort_engine = engines(exported[name])
    rng = np.random.default_rng(0)
    prompts = [rng.integers(3, 60, length).tolist() for length in (5, 2, 7)]
    width = max(map(len, prompts))
    pad = card(name)["pad_token_id"]
    ids = np.array([[pad] * (width - len(p)) + p for p in prompts])
    mask = np.array([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
    steps = 64
    batched_ort = generate(ort_engine, ids, mask, steps)
    batched_torch = generate(torch_engine, ids, mask, steps)
    np.testing.assert_array_equal(batched_ort, batched_torch)
    assert batched_ort.shape == (3, steps)
    for row, prompt in enumerate(prompts):
        alone = generate(ort_engine, np.array([prompt]), None, steps)
        np.testing.assert_array_equal(alone[0], batched_ort[row])


@pytest.mark.parametrize("name", ["gpt-tiny", "transformer-tiny"])
def test_left_padded_rows_compute_the_same_logits_as_alone(name: str,
                                                           exported: Lazy) -> None:
    """Tokens of an untrained model are a weak check; compare the next-token logits."""
    runtime = open_export(exported[name])
    prompts = [[5, 6, 7, 8, 9], [10, 11]]
    ids = np.array([prompts[0], [0, 0, 0, *prompts[1]]])
    mask = np.array([[1] * 5, [0, 0, 0, 1, 1]])
    batched = open_session(runtime)
    first, second = batched.prefill(ids, mask), batched.step(np.array([12, 13]))
    for row, prompt in enumerate(prompts):
        alone = open_session(runtime)
        np.testing.assert_allclose(alone.prefill(np.array([prompt]), None)[0], first[row],
                                   atol=1e-5)
        np.testing.assert_allclose(alone.step(np.array([12 + row]))[0], second[row], atol=1e-5)


def test_sampling_is_seeded_and_identical_between_backends(exported: Lazy) -> None:
    torch_engine, ort_engine = engines(exported["gpt-tiny"])
    prompt = np.array([[5, 6, 7, 8]])
    sampling = Sampling(temperature=1.5, top_k=50, top_p=0.95, seed=7)
    first = generate(ort_engine, prompt, None, 24, sampling)
    np.testing.assert_array_equal(first, generate(torch_engine, prompt, None, 24, sampling))
    np.testing.assert_array_equal(first, generate(ort_engine, prompt, None, 24, sampling))
    other = generate(ort_engine, prompt, None, 24, Sampling(1.5, 50, 0.95, seed=8))
    assert not np.array_equal(first, other)
    greedy = generate(ort_engine, prompt, None, 24)
    assert not np.array_equal(first, greedy)  # temperature 1.5 really samples


def sequence_log_prob(engine: TorchEngine, prompt: np.ndarray, tokens: np.ndarray) -> float:
    ids = np.concatenate([prompt, tokens])[None]
    feeds = {"input_ids": ids, "attention_mask": np.ones_like(ids),
             "position_ids": np.arange(ids.shape[1])[None], **empty_past_feeds(engine.card.fields)}
    logits = engine.run("onnx/model.onnx", feeds)["logits"][0].astype(np.float64)
    log_probs = logits - np.log(np.exp(logits - logits.max(-1, keepdims=True)).sum(-1,
                                keepdims=True)) - logits.max(-1, keepdims=True)
    positions = np.arange(len(prompt) - 1, ids.shape[1] - 1)
    return float(log_probs[positions, ids[0, positions + 1]].sum())


def test_beam_search_finds_at_least_the_greedy_likelihood(exported: Lazy) -> None:
    torch_engine, ort_engine = engines(exported["gpt-tiny"])
    prompt = np.array([9, 10, 11])
    greedy = generate(ort_engine, prompt[None], None, 12)[0]
    beam = generate(ort_engine, prompt[None], None, 12, Sampling(beams=4))[0]
    np.testing.assert_array_equal(beam, generate(torch_engine, prompt[None], None, 12,
                                                 Sampling(beams=4))[0])
    assert sequence_log_prob(torch_engine, prompt, beam) >= \
        sequence_log_prob(torch_engine, prompt, greedy) - 1e-6


@on_shared("transformer-tiny")
def test_enc_dec_beam_search_runs_on_both_backends(exported: Lazy) -> None:
    torch_engine, ort_engine = engines(exported["transformer-tiny"])
    source = np.array([[4, 5, 6, 7, 8]])
    a = generate(ort_engine, source, None, 10, Sampling(beams=3))
    np.testing.assert_array_equal(a, generate(torch_engine, source, None, 10, Sampling(beams=3)))


@pytest.mark.parametrize("name", TINY_CARDS)
def test_metadata_props_and_manifest_are_present_and_correct(name: str, exported: Lazy) -> None:
    folder = exported[name]
    manifest = json.loads((folder / MANIFEST).read_text())
    assert manifest["card"] == card(name).fields
    assert manifest["opset"] == 18
    assert {"torch", "onnx", "numpy"} <= set(manifest["versions"])
    for file, entry in manifest["files"].items():
        assert entry["sha256"] == sha256(folder / file)
    for file in documented_contract(card(name)):
        assert file in manifest["files"]
        model = onnx.load(str(folder / file), load_external_data=False)
        assert manifest["ir_version"] == model.ir_version
        props = {p.key: p.value for p in model.metadata_props}
        assert yaml.safe_load(props["zoo.card"])["d_model"] == card(name)["d_model"]
        assert props["zoo.opset"] == "18"
        assert json.loads(props["zoo.versions"])["torch"] == manifest["versions"]["torch"]


@pytest.mark.parametrize("name", TINY_CARDS)
def test_every_weight_is_stored_once_across_all_onnx_files(name: str,
                                                           exported: Lazy) -> None:
    tiny = card(name)
    sinusoids = tiny["position"] == "sinusoidal"
    assert_weights_stored_once(exported[name],
                               tiny["max_positions"] * tiny["d_model"] * 4 if sinusoids else 0)


@pytest.mark.parametrize("name", TINY_CARDS)
def test_the_parity_grid_runs_sizes_the_trace_never_saw(name: str,
                                                       exported: Lazy) -> None:
    """torch.export specialises what it traced; the grid must run other sizes on every
    dynamic axis of every graph, including 1 (the size export most likes to fix)."""
    family = family_of(card(name))
    cases = family.parity_cases(open_model(*load_built(exported[name])),
                                np.random.default_rng(0))
    seen: dict[tuple[str, str], set[int]] = {}
    for case in cases:
        for graph_input in family.graphs(card(name))[case.file].inputs:
            for axis, size in zip(graph_input.axes, case.feeds[graph_input.name].shape,
                                  strict=True):
                if axis in TRACE_SIZES:
                    seen.setdefault((case.file, axis), set()).add(size)
    assert seen
    for (file, axis), sizes in seen.items():
        assert sizes - {TRACE_SIZES[axis]}, f"{file} {axis}: only the traced size {sizes}"
        if axis in ("batch_size", "sequence_length"):
            assert 1 in sizes, f"{file} {axis}: never 1 ({sizes})"
        if axis == "past_sequence_length":
            assert 0 in sizes and max(sizes) > 0, f"{file} past: {sizes}"


def test_tampered_file_is_detected(exported: Lazy, tmp_path: Path) -> None:
    folder = copy_export(exported["gpt-tiny"], tmp_path)
    with (folder / "onnx/model.onnx").open("ab") as stream:
        stream.write(b"\0")
    with pytest.raises(ManifestError, match="sha256 does not match"):
        read_manifest(folder)
    result = CliRunner().invoke(main, ["parity", str(folder)])
    assert result.exit_code == 2
    assert "model.onnx: sha256 does not match" in result.stderr


def test_the_tolerance_follows_the_outputs_scale() -> None:
    """Logits near 30 (a real model's) may differ by 3e-4 at an element near zero, as float32
    rounding of their sums does (allowed: 1e-4 x 30 + 1e-3 x 0.001); 4e-3 there fails, and so
    does 3e-4 on the same output divided by 30 (allowed: 1e-4 x 1, its largest value being 1)."""
    from export.checks.parity import compare

    logits = np.array([[30.0, -12.0, 0.001, 2.5]], np.float32)
    near_zero = np.array([[0.0, 0.0, 1.0, 0.0]], np.float32)
    assert compare(logits, logits + 3e-4 * near_zero, 1e-4, 1e-3)[2]
    assert not compare(logits, logits + 4e-3 * near_zero, 1e-4, 1e-3)[2]
    assert not compare(logits / 30, logits / 30 + 3e-4 * near_zero, 1e-4, 1e-3)[2]
    assert compare(logits / 30, logits / 30 + 5e-5 * near_zero, 1e-4, 1e-3)[2]


def test_altered_weights_fail_the_parity_check(exported: Lazy,
                                              tmp_path: Path) -> None:
    folder = copy_export(exported["gpt-tiny"], tmp_path)
    model = onnx.load(str(folder / "onnx/model.onnx"))
    tensor = next(t for t in model.graph.initializer if t.name.endswith("token.weight"))
    array = numpy_helper.to_array(tensor).copy()
    array[:, :3] += 0.05
    tensor.CopyFrom(numpy_helper.from_array(array, tensor.name))
    onnx.save(model, str(folder / "onnx/model.onnx"))
    manifest = json.loads((folder / MANIFEST).read_text())  # as if exported this way
    manifest["files"]["onnx/model.onnx"]["sha256"] = sha256(folder / "onnx/model.onnx")
    (folder / MANIFEST).write_text(json.dumps(manifest))
    result = CliRunner().invoke(main, ["parity", str(folder)])
    assert result.exit_code == 2
    assert "NO" in result.stdout and "parity: FAILED" in result.stdout
    assert result.stderr.startswith("error: parity failed")


@pytest.mark.xdist_group("tests/export/test_export.py")  # its own export: any worker
def test_zoo_export_and_parity_cli(tmp_path: Path) -> None:
    """A built folder through `zoo export` (a card name through it:
    tests/runtime/test_embeddings.py)."""
    runner = CliRunner()
    built, out = tmp_path / "built", tmp_path / "bert"
    assert runner.invoke(main, ["build", "bert-tiny", "-o", str(built)]).exit_code == 0
    result = runner.invoke(main, ["export", str(built), "--onnx", "-o", str(out)])
    assert result.exit_code == 0, result.output
    assert "parity: PASSED" in result.stdout
    assert json.loads((out / MANIFEST).read_text())["name"] == "bert-tiny"
    again = runner.invoke(main, ["export", str(built), "--onnx", "-o", str(out)])
    assert again.exit_code == 2 and "already exists" in again.stderr
    result = runner.invoke(main, ["parity", str(out)])
    assert result.exit_code == 0 and "parity: PASSED" in result.stdout


def test_zoo_run_prints_ids_and_the_aggregate_speed(exported: Lazy) -> None:
    result = CliRunner().invoke(main, ["run", str(exported["gpt-tiny"]), "--ids", "1,2,3",
                                       "--ids", "4,5", "--max-new-tokens", "6"])
    assert result.exit_code == 0, result.output
    rows = [line.split(",") for line in result.stdout.strip().splitlines()]
    assert len(rows) == 2 and all(len(row) == 6 for row in rows)
    assert re.search(r"^2 prompts: ([1-9]|1[0-2]) new tokens .* tokens/s aggregate$", result.stderr,
                     re.M), result.stderr


@on_shared("bert-tiny")
def test_zoo_run_prints_encoder_predictions(exported: Lazy) -> None:
    mask = card("bert-tiny")["mask_token_id"]
    result = CliRunner().invoke(main, ["run", str(exported["bert-tiny"]), "--ids",
                                       f"1,2,{mask},4"])
    assert result.exit_code == 0, result.output
    assert result.stdout.startswith("pooled: ")
    assert len(result.stdout.splitlines()[0].split()) == 1 + card("bert-tiny")["d_model"]
    assert "masked position 2:" in result.stdout


@pytest.mark.parametrize("args, message", [
    (["run", "{tmp}/nowhere", "--ids", "1"], "no such folder"),
    (["run", "{tmp}", "--ids", "1"], "not an export"),
    (["parity", "{tmp}"], "not an export"),
    (["run", "{gpt}", "--ids", "1,2,999"], "token ids should be in 0..259"),
    (["run", "{gpt}", "--ids", "1,x"], "expected comma-separated integers"),
    (["run", "{gpt}", "--ids", "1", "--max-new-tokens", "500"], "exceeds max_positions=128"),
    (["run", "{gpt}", "--ids", "1", "--top-p", "0"], "--top-p 0.0"),
    (["run", "{gpt}", "--text", "hello"], "no tokenizer"),
    (["export", "gpt-tiny", "-o", "{tmp}/x"], "--onnx"),
    (["export", "gpt-tiny", "--onnx", "--opset", "7", "-o", "{tmp}/x"], "--opset 7"),
    (["export", "gpt-tiny", "--onnx", "--opset", "26", "-o", "{tmp}/x"], "--opset 26"),
])
def test_bad_input_gives_one_line_and_exit_2(args: list[str], message: str, tmp_path: Path,
                                            exported: Lazy) -> None:
    args = [a.format(tmp=tmp_path, gpt=exported["gpt-tiny"]) for a in args]
    result = CliRunner().invoke(main, args)
    assert_error_after_progress(result, message)
    assert not (tmp_path / "x").exists()


def test_truncated_onnx_is_reported_in_one_line(exported: Lazy,
                                               tmp_path: Path) -> None:
    folder = copy_export(exported["gpt-tiny"], tmp_path)
    onnx_file = folder / "onnx/model.onnx"
    onnx_file.write_bytes(onnx_file.read_bytes()[: onnx_file.stat().st_size // 2])
    manifest = json.loads((folder / MANIFEST).read_text())
    manifest["files"]["onnx/model.onnx"]["sha256"] = sha256(onnx_file)
    (folder / MANIFEST).write_text(json.dumps(manifest))
    result = CliRunner().invoke(main, ["run", str(folder), "--ids", "1"])
    assert result.exit_code == 2
    assert "model.onnx: ONNX Runtime cannot load it" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1


def test_manifest_from_a_newer_format_is_refused(exported: Lazy,
                                                tmp_path: Path) -> None:
    folder = copy_export(exported["gpt-tiny"], tmp_path)
    manifest = json.loads((folder / MANIFEST).read_text())
    manifest["format_version"] = 99
    (folder / MANIFEST).write_text(json.dumps(manifest))
    with pytest.raises(ManifestError, match="format_version=99"):
        read_manifest(folder)


@pytest.mark.parametrize("change, message", [
    (lambda f: f.pop("position_ids"), "missing ['position_ids']"),
    (lambda f: f.update(extra=np.zeros(1)), "unexpected ['extra']"),
    (lambda f: f.update(input_ids=f["input_ids"].astype(np.int32)), "should be int64"),
    (lambda f: f.update(input_ids=f["input_ids"][0]), "should have rank 2"),
    (lambda f: f.update({"past_key_values.0.key": np.zeros(
        past_shape(GPT_TINY, heads=GPT_TINY["n_heads"] - 1), np.float32)}),
     f"axis 1 should be {GPT_TINY['n_heads']}"),
])
def test_feeds_are_validated_before_onnx_runtime(change, message: str,
                                                 exported: Lazy) -> None:
    runtime = open_export(exported["gpt-tiny"])
    feeds = {"input_ids": np.array([[1, 2]]), "attention_mask": np.ones((1, 2), np.int64),
             "position_ids": np.array([[0, 1]]), **empty_past_feeds(GPT_TINY)}
    logits = runtime.run("onnx/model.onnx", dict(feeds))["logits"]
    assert logits.shape == (1, 2, GPT_TINY["vocab_size"])
    change(feeds)
    with pytest.raises(OrtError) as error:
        runtime.run("onnx/model.onnx", feeds)
    assert message in str(error.value)


@pytest.mark.skipif(CUDA, reason="checks the error on a machine without CUDA")
def test_cuda_where_it_is_not_active_is_an_error_not_a_cpu_run(
        exported: Lazy, tmp_path: Path) -> None:
    result = CliRunner().invoke(main, ["run", str(exported["gpt-tiny"]), "--ids", "1",
                                       "--provider", "cuda"])
    assert result.exit_code == 2
    assert "asked for CUDAExecutionProvider but ONNX Runtime runs CPUExecutionProvider" in \
        result.stderr
    result = CliRunner().invoke(main, ["export", "gpt-tiny", "--onnx", "--provider", "cuda",
                                       "-o", str(tmp_path / "x")])
    assert result.exit_code == 2 and not (tmp_path / "x").exists()
    assert "--provider cuda: asked for CUDAExecutionProvider" in result.stderr  # before tracing


@needs_cuda
@pytest.mark.parametrize("name", TINY_CARDS)
def test_cuda_matches_cpu_and_pytorch(name: str, exported: Lazy) -> None:
    torch_engine, cpu = engines(exported[name])
    cuda = open_export(exported[name], "cuda")
    assert cuda.graphs[next(iter(cuda.graphs))].session.get_providers()[0] == \
        "CUDAExecutionProvider"
    assert check_parity(cpu, cuda).passed
    assert check_parity(torch_engine, cuda).passed


@pytest.mark.slow
def test_gpt2_small_export_stores_weights_once(tmp_path: Path) -> None:
    gpt2 = card("gpt2-small")
    export_and_verify(build_model(gpt2), gpt2, tmp_path / "gpt2")
    onnx_bytes = (tmp_path / "gpt2" / "onnx/model.onnx").stat().st_size
    assert onnx_bytes <= 1.01 * (tmp_path / "gpt2" / WEIGHTS).stat().st_size


def test_exports_share_torchs_function_table_and_leave_torch_as_it_was() -> None:
    """torch.onnx builds its table of ONNX functions (about 2 s) on every export: within the
    zoo's exports it is built once per opset, and torch's own method is back afterwards, so
    other exporters in the process (which may add custom translations) get a fresh table."""
    from torch.onnx._internal.exporter._registration import ONNXRegistry

    from export.onnx.trace import registry_built_once

    torchs_own = ONNXRegistry.__dict__["from_torchlib"]
    with registry_built_once():
        first = ONNXRegistry.from_torchlib(opset_version=18)
        assert ONNXRegistry().from_torchlib(opset_version=18) is first  # as torch.onnx calls it
        assert ONNXRegistry.from_torchlib(20) is ONNXRegistry.from_torchlib(20) is not first
    assert ONNXRegistry.__dict__["from_torchlib"] is torchs_own
    assert ONNXRegistry.from_torchlib(opset_version=18) is not first


def test_the_documented_names_come_from_the_documents_tables(tmp_path: Path,
                                                             monkeypatch: pytest.MonkeyPatch
                                                             ) -> None:
    """A name changed in docs/onnx-contract.md changes what the contract tests expect (so a
    writer that names a graph otherwise fails them), and the tables give every name."""
    import tests.support.contract_doc as contract_doc

    gpt = card("gpt-tiny")
    inputs, outputs = contract_doc.documented_contract(gpt)["onnx/model.onnx"]
    layers = range(gpt["n_layers"])
    assert inputs == ["input_ids", "attention_mask", "position_ids",
                      *(f"past_key_values.{i}.{kind}" for i in layers for kind in ("key", "value"))]
    assert outputs == ["logits", *(f"present.{i}.{kind}" for i in layers
                                   for kind in ("key", "value"))]
    edited = tmp_path / "onnx-contract.md"
    edited.write_text(contract_doc.DOC.read_text(encoding="utf-8").replace(
        "`present.{i}.key`, `present.{i}.value`", "`present.{i}.k`, `present.{i}.v`"))
    monkeypatch.setattr(contract_doc, "DOC", edited)
    assert contract_doc.documented_contract(gpt)["onnx/model.onnx"][1][1] == "present.0.k"
