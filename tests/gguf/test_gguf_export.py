"""`zoo export --quantize gguf`: a tiny Llama GGUF file whose linears mix the types a Q4_K_M
file mixes (Q4_K, Q6_K, Q8_0 tied embedding) and the 32-blocks (Q4_0, Q4_1, Q5_0, Q5_1, Q5_K),
written with the `gguf` package, imported and exported plain and --optimize. Every MatMulNBits
the graphs hold, run alone by ONNX Runtime on x = I (the fp32 path) plus its block minimums,
gives `gguf.quants.dequantize` of the file's tensor bit for bit; the export's logits stay near
the fp32 dequantized model's and its greedy tokens are the same."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import pytest
import torch
from onnx import helper, numpy_helper

from runtime.generate import generate, open_session
from tests.support.gguf_files import llama_cpp_permute
from tests.support.helpers import assert_error_after_progress, zoo, zoo_ok
from tests.support.onnx_graphs import nbits_weights
from zoo.files.weights import load_built

gguf = pytest.importorskip("gguf")

D, FF, HEADS, KV, VOCAB, LAYERS = 256, 512, 4, 2, 96, 2
# per layer, what each linear is stored as: a Q4_K_M-like layer, then one of 32-blocks
TYPES = [{"attn_q": "Q4_K", "attn_k": "Q4_K", "attn_v": "Q6_K", "attn_output": "Q4_K",
          "ffn_gate": "Q4_K", "ffn_up": "Q4_K", "ffn_down": "Q6_K"},
         {"attn_q": "Q4_0", "attn_k": "Q4_0", "attn_v": "Q8_0", "attn_output": "Q4_1",
          "ffn_gate": "Q5_1", "ffn_up": "Q5_0", "ffn_down": "Q5_K"}]
SHAPES = {"attn_q": (D, D), "attn_k": (D // 2, D), "attn_v": (D // 2, D),
          "attn_output": (D, D), "ffn_gate": (FF, D), "ffn_up": (FF, D), "ffn_down": (D, FF)}
F16_AT = {"Q4_K": (0, 2), "Q5_K": (0, 2), "Q6_K": (208,), "Q2_K": (80, 82)}


def blocks(kind: str, shape: tuple[int, int], rng: np.random.Generator) -> np.ndarray:
    """(rows, row bytes) of `kind` for a weight of `shape`: gguf's quantize of a random weight
    where it has one, else random bytes with small float16 scales (every code is valid)."""
    qtype = gguf.GGMLQuantizationType[kind]
    if kind not in F16_AT:
        return gguf.quants.quantize((rng.standard_normal(shape) * 0.1).astype(np.float32),
                                    qtype)
    block, size = gguf.GGML_QUANT_SIZES[qtype]
    raw = rng.integers(0, 256, (shape[0] * shape[1] // block, size), dtype=np.uint8)
    for at in F16_AT[kind]:
        scale = (rng.random((raw.shape[0], 1)) * 4e-4 + 1e-4).astype(np.float16)
        raw[:, at:at + 2] = scale.view(np.uint8)
    return raw.reshape(shape[0], -1)


def write_file(path: Path, types: list[dict[str, str]] = TYPES) -> dict[str, np.ndarray]:
    """The tiny file; returns {gguf name: raw blocks as written} (query/key rows permuted as
    llama.cpp writes them, so blocks and dequantize both are the file's)."""
    rng = np.random.default_rng(0)
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_name("tiny mixed")
    writer.add_block_count(LAYERS)
    writer.add_context_length(64)
    writer.add_embedding_length(D)
    writer.add_feed_forward_length(FF)
    writer.add_head_count(HEADS)
    writer.add_head_count_kv(KV)
    writer.add_rope_freq_base(10000.0)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    writer.add_pad_token_id(0)
    written = {}
    table = (rng.standard_normal((VOCAB, D)) * 0.5).astype(np.float32)
    written["token_embd.weight"] = gguf.quants.quantize(table, gguf.GGMLQuantizationType.Q8_0)
    for layer, kinds in enumerate(types):
        for part, kind in kinds.items():
            written[f"blk.{layer}.{part}.weight"] = blocks(kind, SHAPES[part], rng)
        for norm in ("attn_norm", "ffn_norm"):
            writer.add_tensor(f"blk.{layer}.{norm}.weight",
                              (1 + 0.1 * rng.standard_normal(D)).astype(np.float32))
    writer.add_tensor("output_norm.weight", np.ones(D, np.float32))
    for name, raw in written.items():
        kind = "Q8_0" if name == "token_embd.weight" else types[int(name.split(".")[1])][
            name.split(".")[2]]
        writer.add_tensor(name, raw, raw_dtype=gguf.GGMLQuantizationType[kind])
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return written


def file_weight(written: dict[str, np.ndarray], name: str, kind: str) -> np.ndarray:
    """gguf's dequantize of a tensor, its rows in Hugging Face's order (the zoo's): the
    inverse of llama_cpp_permute for query and key."""
    weight = gguf.quants.dequantize(written[name], gguf.GGMLQuantizationType[kind])
    part = name.split(".")[-2]
    if part in ("attn_q", "attn_k"):
        heads = HEADS if part == "attn_q" else KV
        rows = weight.shape[0]
        weight = weight.reshape(heads, rows // heads // 2, 2, -1).swapaxes(1, 2) \
            .reshape(weight.shape)
        assert np.array_equal(llama_cpp_permute(weight, heads),
                              gguf.quants.dequantize(written[name],
                                                     gguf.GGMLQuantizationType[kind]))
    return weight


ZOO_NAMES = {"attn_q": "self_attention.query", "attn_k": "self_attention.key",
             "attn_v": "self_attention.value", "attn_output": "self_attention.out",
             "ffn_gate": "feed_forward.gate", "ffn_up": "feed_forward.up",
             "ffn_down": "feed_forward.down"}


@pytest.fixture(scope="module")
def made(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, np.ndarray]]:
    work = tmp_path_factory.mktemp("gguf_export")
    written = write_file(work / "tiny.gguf")
    zoo_ok("import", work / "tiny.gguf", "-o", work / "imported")
    return work, written


def expected_weights(written: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """{gguf name: the file's dequantized weight, zoo row order}."""
    found = {"token_embd.weight": gguf.quants.dequantize(written["token_embd.weight"],
                                                         gguf.GGMLQuantizationType.Q8_0)}
    for layer, kinds in enumerate(TYPES):
        for part, kind in kinds.items():
            name = f"blk.{layer}.{part}.weight"
            found[name] = file_weight(written, name, kind)
    return found


def same_bits(a: np.ndarray, b: np.ndarray) -> bool:
    a, b = np.asarray(a, np.float32) + np.float32(0), np.asarray(b, np.float32) + np.float32(0)
    return a.shape == b.shape and np.array_equal(a.view(np.uint32), b.view(np.uint32))


def test_the_import_keeps_the_files_blocks(made: tuple[Path, dict]) -> None:
    work, written = made
    index = json.loads((work / "imported" / "gguf_blocks.json").read_text())
    from safetensors.numpy import load_file

    raw = load_file(str(work / "imported" / "gguf_blocks.safetensors"))
    assert len(index) == 1 + 7 * LAYERS
    model, _ = load_built(work / "imported")
    state = model.state_dict()
    expected = expected_weights(written)
    for name, entry in index.items():
        kind = gguf.GGMLQuantizationType[entry["type"]]
        assert same_bits(gguf.quants.dequantize(raw[name], kind), state[name].numpy())
        assert same_bits(state[name].numpy(), expected[entry["gguf"]])


# plain: make test-slow (plain gguf graphs' MatMulNBits are held bit for bit in
# test_a_qwen2_file_... and tests/gguf/test_gguf_moe_export.py); optimize: this file's logits
# test reads its export
@pytest.mark.parametrize("optimize", [pytest.param(False, marks=pytest.mark.slow), True],
                         ids=["plain", "optimize"])
def test_the_exports_matmuls_hold_the_files_weights_bit_for_bit(
        made: tuple[Path, dict], optimize: bool) -> None:
    work, written = made
    out = work / f"export-{optimize}"
    output = zoo_ok("export", work / "imported", "--onnx", "-o", out, "--quantize", "gguf",
                    *(["--optimize"] if optimize else []))
    assert ("GGUF blocks kept: 2 Q4_0, 1 Q4_1, 5 Q4_K, 1 Q5_0, 1 Q5_1, 1 Q5_K, 2 Q6_K, 2 Q8_0"
            in output)
    manifest = json.loads((out / "manifest.json").read_text())["quantization"]
    assert manifest["types"] == {"Q4_0": 2, "Q4_1": 1, "Q4_K": 5, "Q5_0": 1,
                                 "Q5_1": 1, "Q5_K": 1, "Q6_K": 2, "Q8_0": 2}
    assert manifest["tensors"]["layers.0.self_attention.value.weight"]["form"].startswith(
        "MatMulNBits bits 8, block 16, zero point 32")
    assert manifest["agreement"]["passed"]
    assert manifest["float_activations"] == [f"layers.{layer}.feed_forward.down.weight"
                                             for layer in range(LAYERS)]
    expected = expected_weights(written)
    by_zoo = {f"layers.{layer}.{ZOO_NAMES[part]}.weight": f"blk.{layer}.{part}.weight"
              for layer in range(LAYERS) for part in SHAPES}
    by_zoo["head.weight"] = "token_embd.weight"  # tied: the head is the embedding's blocks
    graphs = sorted(out.rglob("*.onnx"))
    assert graphs
    for graph in graphs:
        model = onnx.load(str(graph))
        ops = [node.op_type for node in model.graph.node]
        if "MatMulNBits" not in ops:
            continue
        levels = {node.name: helper.get_attribute_value(next(
            a for a in node.attribute if a.name == "accuracy_level"))
            for node in model.graph.node if node.op_type == "MatMulNBits"}
        assert {name: level for name, level in levels.items() if level == 0} == {
            name: 0 for name in levels if ".feed_forward.down." in name}
        covered = []
        for prefix, weight in nbits_weights(model):
            names = prefix.split("+")
            assert same_bits(weight, np.concatenate([expected[by_zoo[n]] for n in names]))
            covered += names
        assert sorted(covered) == sorted(by_zoo), graph
        assert "GatherBlockQuantized" in ops and "Gather" not in [
            node.op_type for node in model.graph.node if node.input[0].startswith("embed")]
    # the embedding and tied head share their bytes once on disk
    data = sum(path.stat().st_size for path in out.rglob("*.onnx*"))
    assert data < 2.2 * sum(raw.nbytes for raw in written.values()) * (
        2 if not optimize else 1) + 200_000


def test_logits_and_greedy_tokens_follow_the_fp32_model(made: tuple[Path, dict]) -> None:
    """Only the int8 activations of accuracy_level 4 differ from the fp32 dequantized model:
    logits within 5% of their range, and the same 16 greedy tokens."""
    import zoo as api

    work, _ = made
    out = work / "export-True"
    if not out.exists():
        zoo_ok("export", work / "imported", "--onnx", "-o", out, "--quantize", "gguf",
               "--optimize")
    model, _ = load_built(work / "imported")
    ids = np.array([[1, 5, 9, 14, 30, 41, 7, 60, 3]], np.int64)
    with torch.no_grad():
        expected = model(torch.from_numpy(ids))[0].numpy()
    runtime = api.load(out).runtime
    got = open_session(runtime, ids.shape[1] + 1).prefill(ids, None)
    spread = float(np.ptp(expected[:, -1]))
    assert spread > 1.0
    assert np.abs(got - expected[:, -1]).max() <= 0.05 * spread
    tokens = generate(runtime, ids, None, 16)
    reference = ids
    for _ in range(16):
        with torch.no_grad():
            step = model(torch.from_numpy(reference))[0][:, -1].argmax(-1).numpy()
        reference = np.concatenate([reference, step[:, None]], axis=1)
    assert np.array_equal(np.asarray(tokens).reshape(-1)[-16:], reference[0, -16:])


def test_a_type_with_no_exact_form_is_refused_by_tensor_and_type(tmp_path: Path) -> None:
    types = [dict(TYPES[0], ffn_up="Q2_K"), TYPES[1]]
    write_file(tmp_path / "q2.gguf", types)
    zoo_ok("import", tmp_path / "q2.gguf", "-o", tmp_path / "imported")
    result = zoo("export", tmp_path / "imported", "--onnx", "-o", tmp_path / "out",
                 "--quantize", "gguf")
    assert_error_after_progress(result, "blk.0.ffn_up.weight", "Q2_K")
    assert not (tmp_path / "out").exists()


def test_a_folder_without_blocks_is_refused_with_what_to_do(made: tuple[Path, dict],
                                                            tmp_path: Path) -> None:
    work, _ = made
    result = zoo("export", "llama-tiny", "--onnx", "-o", tmp_path / "a", "--quantize", "gguf")
    assert_error_after_progress(result, "llama-tiny", "zoo import FILE.gguf")
    bare = tmp_path / "bare"  # an imported folder, less its blocks
    for path in (work / "imported").iterdir():
        if not path.name.startswith("gguf_blocks"):
            bare.mkdir(exist_ok=True)
            (bare / path.name).write_bytes(path.read_bytes())
    result = zoo("export", bare, "--onnx", "-o", tmp_path / "b", "--quantize", "gguf")
    assert_error_after_progress(result, "gguf_blocks.json", "zoo import FILE.gguf")


@pytest.mark.slow
def test_the_packaged_smollm2_exports_its_own_blocks_and_answers(tmp_path: Path) -> None:
    """SmolLM2-135M-Instruct (210 Q4_1 linears, a Q8_0 tied embedding): the export's graphs
    hold the file's 211 tensors as MatMulNBits / GatherBlockQuantized, its ONNX files are at
    most 1.3x the GGUF file (measured 1.17x: fp32 scales and minimums where ggml keeps float16),
    and `zoo run --chat` answers. About 8 minutes on a loaded 2-core machine."""
    from tests.conftest import packaged_smollm2

    file = packaged_smollm2()
    zoo_ok("import", file, "-o", tmp_path / "smol")
    out = tmp_path / "smol-gguf"
    output = zoo_ok("export", tmp_path / "smol", "--onnx", "--optimize", "--quantize", "gguf",
                    "-o", out)
    assert "GGUF blocks kept: 210 Q4_1, 1 Q8_0" in output
    onnx_bytes = sum(path.stat().st_size for path in (out / "onnx").iterdir())
    assert onnx_bytes <= 1.3 * file.stat().st_size
    answer = zoo_ok("run", out, "--chat", "What is the capital of France?",
                    "--max-new-tokens", "16")
    assert "Paris" in answer


def test_a_qwen2_file_with_biases_and_float_tensors_exports_its_blocks(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Qwen2 (query/key/value biases, untied head) written with Q8_0 where a row holds whole
    32-blocks and F32 elsewhere (the feed-forward down projection, 48 inputs): the Q8_0
    linears become MatMulNBits holding the file's weights, the F32 one stays a MatMul."""
    from tests.support.gguf_architectures import hf_model, write_gguf

    add_tensor = gguf.GGUFWriter.add_tensor

    def quantized(self: object, name: str, array: np.ndarray, **kwargs: object) -> None:
        if array.ndim == 2 and array.shape[1] % 32 == 0:
            raw = gguf.quants.quantize(array, gguf.GGMLQuantizationType.Q8_0)
            return add_tensor(self, name, raw, raw_dtype=gguf.GGMLQuantizationType.Q8_0)
        return add_tensor(self, name, array, **kwargs)

    monkeypatch.setattr(gguf.GGUFWriter, "add_tensor", quantized)
    write_gguf(hf_model("qwen2", tie=False), tmp_path / "qwen2.gguf", "qwen2")
    zoo_ok("import", tmp_path / "qwen2.gguf", "-o", tmp_path / "imported")
    zoo_ok("export", tmp_path / "imported", "--onnx", "-o", tmp_path / "out", "--quantize",
           "gguf")
    manifest = json.loads((tmp_path / "out" / "manifest.json").read_text())["quantization"]
    assert manifest["types"] == {"Q8_0": 2 + 6 * 2}  # embedding, head; q, k, v, o, gate, up
    model = onnx.load(str(tmp_path / "out" / "onnx" / "model_q4.onnx"))
    state = load_built(tmp_path / "imported")[0].state_dict()
    weights = dict(nbits_weights(model))
    for prefix, weight in weights.items():
        assert same_bits(weight, np.concatenate([state[n].numpy() for n in prefix.split("+")]))
    assert sorted(n for prefix in weights for n in prefix.split("+")) == sorted(
        name for name, entry in manifest["tensors"].items() if "Gather" not in entry["form"])
    inits = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    floats = [node for node in model.graph.node if node.op_type == "MatMul"
              and inits.get(node.input[1], np.empty(0)).shape == (48, 32)]
    assert len(floats) == 2  # each layer's down projection, as the file's F32
