"""Speed work on the tiny cards: `zoo bench` (every JSON field present and finite; no timing
assertions), --optimize and --quantize exports (each passes its parity or agreement check), and
the shared-cache decode loop (the plain loop's tokens)."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest
from click.testing import CliRunner
from onnx import numpy_helper

from cli import main
from export.checks.parity import check_parity
from export.checks.verify import check_agreement
from export.onnx.quantize import QuantizeError, check_choice
from export.onnx.shared_cache import KV_FILE
from export.opening import open_export, open_model
from export.options import ExportOptions
from export.pipeline import export_and_verify
from runtime.contract import MANIFEST
from runtime.generate import generate
from runtime.sampling import Sampling
from tests.conftest import (
    TINY_CARDS,
    SharedExport,
    assert_weights_stored_once,
    card,
    on_shared,
    stored_tensor_bytes,
    traces_reused,
)
from tests.support.contract_doc import (
    documented_contract,
    documented_layout,
    documented_stored_name,
)
from zoo.assemble import build_model
from zoo.files.weights import load_built

# The tests that read the session's shared exports run in their card's pytest-xdist group, so
# each export is made once (tests/conftest.py: shared_export, on_shared); the tests that make
# their own export run in this file's group, wherever a worker is free.
pytestmark = on_shared("gpt-tiny")
OWN_EXPORT = pytest.mark.xdist_group("tests/export/test_bench.py")

VARIANTS = ["optimize", "int8", "int4"]


# The tiny cards of the first three families; the later ones (gemma, moe, modernbert, t5) run
# their variants in their own test files (test_gemma, test_moe_export, test_modernbert,
# test_t5), and here only in `make test-slow`, to keep the default run's time.
FIRST_TINY = ("bert-tiny", "gpt-tiny", "llama-tiny", "transformer-tiny")


def variant_cases(variants: list[str]) -> list:
    """Every (card, variant); int4 of the encoder and the encoder-decoder only in `make
    test-slow`: it quantizes the same MatMuls as int8, which runs for every family by default,
    and int4 itself runs on gpt-tiny (two exports off the default run's time)."""
    return [pytest.param(name, variant, marks=pytest.mark.slow)
            if (variant == "int4" and name != "gpt-tiny") or name not in FIRST_TINY
            else (name, variant)
            for variant in variants for name in TINY_CARDS]


@pytest.fixture(scope="module")
def exports(shared_export: SharedExport) -> SharedExport:
    """(card, variant) -> (folder, report), exported once per session; exporting runs its
    check."""
    return shared_export


def finite_numbers(value: Any) -> bool:
    """True when every number in a nested result is finite."""
    if isinstance(value, dict):
        return all(finite_numbers(v) for v in value.values())
    if isinstance(value, list):
        return all(finite_numbers(v) for v in value)
    if isinstance(value, bool | str):
        return True
    if isinstance(value, int | float):
        return math.isfinite(value)
    return False

def grid_outputs(fields: dict) -> set[str]:
    """The parity rows a full grid has: every output of every file, all layers' cache as one;
    and an encoder-decoder's seq2seq layout's outputs, each layer's cache of a kind as one."""
    labels = set()
    for file, (_, outputs) in documented_contract(fields).items():
        prefix = "" if file == "onnx/model.onnx" else f"{file.removesuffix('.onnx')}:"
        labels |= {prefix + ("present.*" if o.startswith("present.") else o) for o in outputs}
    for _, outputs in documented_layout(fields).values() if fields["family"] == (
            "encoder-decoder") else ():
        labels |= {"layout:" + re.sub(r"\.\d+\.(\w+)\.(key|value)$", r".*.\1.*", o)
                   for o in outputs}
    return labels


def assert_check_ran(report, fields: dict) -> None:
    """export_and_verify raises on failure, so `passed` proves nothing; an empty or partial
    check would pass too. Parity: a row for every output, each within the tolerance (max rel
    is <= 1 whenever |diff| <= atol + rtol * |torch|). Agreement: positions were compared."""
    check = report.check
    if hasattr(check, "quantization"):
        assert check.rows and all(row.positions > 0 for row in check.rows), check.table()
        return
    loop = [what for what, _, _ in check.generation if what == "shared-cache loop vs plain loop"]
    expected = grid_outputs(fields) | ({"model_kv:logits"} if loop else set())
    assert {row.output for row in check.rows} == expected, check.table()
    assert all(row.max_rel <= 1.0 for row in check.rows), check.table()
    if fields["family"] != "encoder":
        assert check.generation, check.table()


@pytest.mark.parametrize("name, variant", variant_cases(VARIANTS))
def test_every_variant_export_passes_its_check(name: str, variant: str, exports) -> None:
    folder, report = exports(name, variant)
    assert_check_ran(report, card(name).fields)
    manifest = json.loads((folder / MANIFEST).read_text())
    quantize = None if variant == "optimize" else variant
    for file, (inputs, outputs) in documented_contract(card(name)).items():
        stored = documented_stored_name(file, quantize)  # onnx/model_q4.onnx for int4
        assert stored in manifest["graphs"] and stored in manifest["files"]
        model = onnx.load(str(folder / stored), load_external_data=False)
        assert [i.name for i in model.graph.input] == inputs  # the contract is kept
        assert [o.name for o in model.graph.output] == outputs
    if variant == "optimize":
        assert "optimization" in manifest and "quantization" not in manifest
        assert "fused operators in" in report.table()
        # Re-checked from the folder, the way `zoo parity` does it.
        model, loaded = load_built(folder)
        assert check_parity(open_model(model, loaded), open_export(folder)).passed
    else:
        quantization = manifest["quantization"]
        assert quantization["weights"] == variant and quantization["agreement"]["passed"]
        assert "agreement" in report.table() and "PASSED" in report.table()
        # `zoo parity` on a quantized folder runs the agreement check, not the fp32 grid.
        result = CliRunner().invoke(main, ["parity", str(folder)])
        assert result.exit_code == 0, result.output
        assert f"agreement ({variant} vs fp32" in result.stdout


def test_optimized_decoder_carries_the_shared_cache_graph(exports) -> None:
    folder, report = exports("gpt-tiny", "optimize")
    manifest = json.loads((folder / MANIFEST).read_text())
    assert manifest["generation"]["file"] == KV_FILE
    assert KV_FILE in manifest["files"]  # with its sha256, like every file
    ops = {node.op_type for node in onnx.load(str(folder / KV_FILE),
                                              load_external_data=False).graph.node}
    assert "GroupQueryAttention" in ops
    assert "shared-cache loop vs plain loop" in report.table()
    # Every weight is still stored once across model.onnx, model_kv.onnx and model_genai.onnx.
    assert_weights_stored_once(folder)


def quantized_bytes(rows: int, columns: int, bits: int) -> int:
    """MatMulNBits' storage of a (K=rows, N=columns) weight in blocks of 32 along K: N x blocks
    x 32 * bits / 8 bytes of packed integers, plus one fp32 scale per block."""
    blocks = -(-rows // 32)
    return columns * blocks * (32 * bits // 8 + 4)


@pytest.mark.parametrize("name, variant", variant_cases(["int8", "int4"]))
def test_quantized_exports_hold_the_quantized_operators_and_are_smaller(
        name: str, variant: str, exports) -> None:
    """Every constant-weight MatMul of the fp32 graph became a MatMulNBits of that weight's
    shape and bit width, the packed weights have the size the format implies, and the files
    are smaller by what that saves."""
    bits = int(variant.removeprefix("int"))
    plain, _ = exports(name, "plain")
    folder, _ = exports(name, variant)
    saved: dict[str, int] = {}  # per fp32 weight: bytes quantizing it saves (or costs)
    for file in documented_contract(card(name)):
        fp32 = onnx.load(str(plain / file))
        weights = {t.name: tuple(t.dims) for t in fp32.graph.initializer}
        transposed = {n.output[0]: n.input[0] for n in fp32.graph.node
                      if n.op_type == "Transpose" and n.input[0] in weights}
        expected = []
        for node in fp32.graph.node:
            if node.op_type != "MatMul":
                continue
            if node.input[1] in weights:  # (K, N): the fp32 copy goes away
                rows, columns = weights[node.input[1]]
                saved[node.input[1]] = rows * columns * 4 - quantized_bytes(rows, columns, bits)
            elif node.input[1] in transposed:  # a tied head: the table stays for the Gather
                columns, rows = weights[transposed[node.input[1]]]
                saved[f"{file}:{node.name}"] = -quantized_bytes(rows, columns, bits)
            else:
                continue
            expected.append((rows, columns))
        quantized = onnx.load(str(folder / documented_stored_name(file, variant)))
        packed = {t.name: t for t in quantized.graph.initializer}
        found = []
        for node in quantized.graph.node:
            if node.op_type != "MatMulNBits":
                continue
            attributes = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
            assert attributes["bits"] == bits and attributes["block_size"] == 32
            found.append((attributes["K"], attributes["N"]))
            data = numpy_helper.to_array(packed[node.input[1]]).nbytes
            scales = numpy_helper.to_array(packed[node.input[2]]).nbytes
            assert data + scales == quantized_bytes(attributes["K"], attributes["N"], bits)
        assert expected and sorted(found) == sorted(expected), file
        assert not any(n.op_type == "MatMul" and n.input[1] in packed
                       for n in quantized.graph.node)  # no fp32 weight MatMul is left
    assert sum(saved.values()) > 0
    assert stored_tensor_bytes(folder) <= stored_tensor_bytes(plain) - sum(saved.values()) + 1024


@on_shared("bert-tiny")
def test_missing_attention_fusion_is_reported(exports) -> None:
    folder, report = exports("bert-tiny", "optimize")
    not_fused = json.loads((folder / MANIFEST).read_text())["optimization"]["not_fused"]
    assert any("Attention" in message for message in not_fused)
    assert "expected fusion Attention" in report.table()


@pytest.mark.parametrize("sampling", [Sampling(), Sampling(beams=3),
                                      Sampling(temperature=1.2, top_k=20, seed=3)])
def test_reused_buffer_loop_gives_the_plain_loops_tokens(exports, sampling: Sampling) -> None:
    folder, _ = exports("gpt-tiny", "optimize")
    runtime = open_export(folder)
    assert runtime.kv_graph is not None
    rng = np.random.default_rng(1)
    prompts = [rng.integers(3, 250, length).tolist() for length in (6, 2, 9)]
    width = max(map(len, prompts))
    ids = np.array([[256] * (width - len(p)) + p for p in prompts])
    mask = np.array([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
    steps = card("gpt-tiny")["max_positions"] - width
    fast = generate(runtime, ids, mask, steps, sampling)
    plain = generate(runtime, ids, mask, steps, sampling, shared_cache=False)
    np.testing.assert_array_equal(fast, plain)
    model, loaded = load_built(folder)
    np.testing.assert_array_equal(fast, generate(open_model(model, loaded), ids, mask, steps,
                                                 sampling))


def test_quantized_agreement_is_measured_against_fp32(exports) -> None:
    folder, _ = exports("gpt-tiny", "int4")
    model, loaded = load_built(folder)
    report = check_agreement(open_model(model, loaded), open_export(folder), "int4")
    row = report.rows[0]
    assert row.positions == 64 and 0 < row.max_logit_diff < 1
    with pytest.raises(QuantizeError, match="--quantize int3"):
        check_choice("int3")


def bench_json(tmp_path: Path, *args: str) -> dict:
    out = tmp_path / "bench.json"
    result = CliRunner().invoke(main, ["bench", *args, "--repeats", "1", "--json", str(out)])
    assert result.exit_code == 0, result.output
    assert "bench " in result.stderr  # progress lines
    assert "median" in result.stdout
    again = CliRunner().invoke(main, ["bench", *args, "--json", str(out)])
    assert again.exit_code == 2 and "already exists" in again.stderr
    return json.loads(out.read_text())


FIGURE_KEYS = {"median_ms", "p10_ms", "p90_ms", "min_ms", "max_ms", "runs"}


def check_result(result: dict, family: str) -> None:
    assert finite_numbers(result)
    assert {"format_version", "date", "model", "export", "settings", "machine", "versions",
            "measurements", "summary", "seconds"} <= set(result)
    machine = result["machine"]
    for key in ("ort_flops_per_s", "torch_flops_per_s", "numpy_bytes_per_s",
                "torch_bytes_per_s", "ort_gemv_bytes_per_s", "bound_bytes_per_s"):
        assert machine[key] > 0
    assert result["model"]["family"] == family
    for name, engines in result["measurements"].items():
        assert set(engines) == {"torch", "ort", "ort_plain"}, name
        for figure in engines.values():
            assert FIGURE_KEYS <= set(figure), name
            assert "fraction_of_limit" in figure
            assert all(isinstance(v, float) for v in figure.values())
    assert result["summary"] and all(isinstance(v, float) for v in result["summary"].values())


def test_zoo_bench_decoder_writes_every_figure(exports, tmp_path: Path) -> None:
    folder, _ = exports("gpt-tiny", "optimize")
    result = bench_json(tmp_path, str(folder))
    check_result(result, "decoder")
    names = set(result["measurements"])
    assert {"prefill_32", "decode_past_16", "decode_past_127", "greedy_64"} == names
    assert {"greedy_speedup_ort_over_torch", "greedy_ort_fraction_of_bandwidth",
            "decode_longest_over_shortest_past_ort", "onnx_bytes_over_safetensors"} <= set(
        result["summary"])
    assert result["export"]["shared_cache_graph"] is True
    assert "tokens_per_s" in result["measurements"]["greedy_64"]["ort"]


@on_shared("gpt-tiny")
def test_zoo_bench_exports_a_card_name_first(tmp_path: Path, shared_export: SharedExport,
                                             shared_traces: dict) -> None:
    """To a temporary folder; `--seed 1` builds the shared export's weights, so its graph is
    the one this worker traced already (no new trace is the proof that the seed was used)."""
    shared_export("gpt-tiny")
    traced = len(shared_traces)
    with traces_reused(shared_traces):
        result = bench_json(tmp_path, "gpt-tiny", "--no-optimize", "--seed", "1")
    assert len(shared_traces) == traced
    check_result(result, "decoder")
    assert result["export"]["optimized"] is False
    assert result["export"]["shared_cache_graph"] is False


@on_shared("transformer-tiny")
def test_zoo_bench_encoder_decoder_writes_every_figure(exports, tmp_path: Path) -> None:
    folder, _ = exports("transformer-tiny", "optimize")
    result = bench_json(tmp_path, str(folder))
    check_result(result, "encoder-decoder")
    steps = {f"decode_source_{s}{when}" for s in (16, 128) for when in ("", "_before")}
    assert {"encoder_b1_s128", "decode_past_16", "decode_past_127"} | steps == set(
        result["measurements"])  # max_positions 128: source 512 is capped at 128
    assert {"encoder_ort_over_torch_latency", "decode_speedup_ort_over_torch",
            "decode_longest_over_shortest_source_ort",
            "decode_source_128_speedup_over_before_ort"} <= set(result["summary"])


@OWN_EXPORT
def test_shared_cache_graph_follows_other_blocks(tmp_path: Path) -> None:
    """Rotary positions (applied before GroupQueryAttention), RMSNorm and SwiGLU, no biases."""
    variant = card("gpt-tiny", position="rotary", norm="rmsnorm", activation="swiglu",
                   bias=False, n_layers=1)
    folder = tmp_path / "variant"
    report = export_and_verify(build_model(variant, seed=2), variant, folder,
                               ExportOptions(optimize=True))
    assert_check_ran(report, variant.fields)
    generation = {what: steps for what, _, steps in report.check.generation}
    assert generation["shared-cache loop vs plain loop"] > 0, report.table()  # the loop ran


def test_every_family_is_measured_and_drawn_through_its_spec() -> None:
    """`zoo bench` and `zoo attention` find each family's pieces by its spec (the Family object
    holds export only); a spec nothing registered for is one error naming it."""
    from dataclasses import replace

    from export.bench.families import bench_of
    from export.families import FAMILIES
    from export.inspect.maps import maps_of
    from registry.errors import ZooError
    from registry.families import DECODER, ENCODER, SEQUENCE

    specs = {family.spec for family in FAMILIES.values()}
    specs |= {spec.pooled_variant for spec in specs if spec.pooled_variant is not None}
    unmeasured = {"dual-encoder"}  # refused by name (tests/export/test_unmeasured_families.py)
    for spec in specs:  # a family added without its benchmark or maps fails here
        if spec.kind in unmeasured:
            continue
        assert callable(bench_of(spec).measure) and callable(maps_of(spec))
    assert unmeasured <= {spec.kind for spec in specs}  # so the list cannot outlive a family
    # a pooled decoder runs like an encoder: measured and drawn as one (as before the move)
    assert bench_of(SEQUENCE) is bench_of(ENCODER) and maps_of(SEQUENCE) is maps_of(ENCODER)
    assert bench_of(DECODER) is not bench_of(ENCODER)
    stranger = replace(next(iter(specs)), kind="a plugin's family")
    for lookup in (bench_of, maps_of):
        with pytest.raises(ZooError, match="a plugin's family"):
            lookup(stranger)
