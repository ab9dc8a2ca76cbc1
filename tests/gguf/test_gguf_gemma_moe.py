"""GGUF files of Gemma 2, Gemma 3 and the mixtures of experts (Qwen3-MoE, OLMoE, and Mixtral,
which llama.cpp writes as `llama` with an expert_count), written here as llama.cpp's
convert_hf_to_gguf.py writes them from a tiny random transformers model: its metadata keys,
tensor names from the gguf package's own table, Gemma's norms stored as 1 + w, every expert of a
layer fused in one 3-D tensor (one file's experts quantized to Q8_0), Llama's query and key rows
reordered for Mixtral. `zoo import` must give transformers' logits on a left-padded batch of
prompts longer than Gemma's window; what llama.cpp computes otherwise than the zoo is refused by
its key. Also: the query scale llama.cpp takes from the layer count (its 27B models)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from click.testing import CliRunner

import cli
from tests.support.gguf_gemma_moe import CASES, SIZES, converted, metadata
from tests.support.greedy import padded
from tests.support.helpers import assert_one_line_error
from tests.support.hf_decoders import assert_padded_logits_match, randomise
from zoo.files.weights import load_built

gguf = pytest.importorskip("gguf")
transformers = pytest.importorskip("transformers")

ATOL = 1e-4
PROMPTS = [[11, 52, 7, 80, 33, 19, 64, 21, 45, 70, 14, 88, 30], [40, 9, 71, 23, 5, 66, 12, 57,
                                                                  90, 31]]


def hf_model(kind: str) -> torch.nn.Module:
    _, config_class, model_class, own = CASES[kind]
    config = getattr(transformers, config_class)(**SIZES | own)
    model = getattr(transformers, model_class)(config)
    # norms (Gemma's offsets from one; others' near one) far from init
    return randomise(model, norm_mean=0.0 if "gemma" in kind else 1.0, bias_std=0.2)


def write_gguf(model: torch.nn.Module, path: Path, kind: str,
               extra: dict[str, Any] | None = None, quantized: tuple[str, ...] = ()
               ) -> dict[str, np.ndarray]:
    """The file; tensors whose name has a part in `quantized` stored as Q8_0. Returns each
    tensor as the file holds it, dequantized (what transformers' model must be given)."""
    writer = gguf.GGUFWriter(str(path), CASES[kind][0])
    metadata(writer, kind, model.config)
    for key, value in (extra or {}).items():
        writer.add_key_value(key, value, gguf.GGUFValueType.STRING if isinstance(value, str)
                             else gguf.GGUFValueType.FLOAT32)
    held = {}
    for name, array in converted(model, kind).items():
        if any(part in name for part in quantized):
            blocks = gguf.quants.quantize(array, gguf.GGMLQuantizationType.Q8_0)
            writer.add_tensor(name, blocks, raw_dtype=gguf.GGMLQuantizationType.Q8_0)
            array = gguf.quants.dequantize(blocks, gguf.GGMLQuantizationType.Q8_0)
        else:
            writer.add_tensor(name, array)
        held[name] = array
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return held


def imported(path: Path, out: Path) -> Any:
    result = CliRunner().invoke(cli.main, ["import", str(path), "-o", str(out)])
    assert result.exit_code == 0, result.output
    return load_built(out)


@pytest.mark.parametrize("kind", list(CASES))
def test_a_gguf_file_of_each_gives_transformers_logits(tmp_path: Path, kind: str) -> None:
    model = hf_model(kind)
    write_gguf(model, tmp_path / "tiny.gguf", kind)
    ours, card = imported(tmp_path / "tiny.gguf", tmp_path / "out")
    config = model.config
    if "gemma" in kind:  # the window shorter than the prompts, both kinds of layer there
        assert (card["sliding_window"], card["head_dim"]) == (8, 16)
        assert len(PROMPTS[0]) > card["sliding_window"]
    else:
        assert (card["activation"], card["n_experts"], card["n_experts_per_token"]) == (
            "moe", 4, 2)
        assert card["norm_topk_prob"] == (kind != "olmoe")
    expected = {"gemma2": ("LG", 10000.0, None, 2.0, 3.0),
                "gemma3": ("LLLLLG", 5000.0, 300.0, None, None),
                "gemma3-older": ("LLLLLG", 5000.0, 10000.0, None, 4.0)}
    if kind in expected:
        assert (card["attention_pattern"], card["rope_theta"], card["rope_theta_local"],
                card["attn_logit_softcapping"], card["final_logit_softcapping"]) == (
            expected[kind])
        assert [t == "full_attention" for t in config.layer_types] == [  # transformers' own
            card["attention_pattern"][i % len(card["attention_pattern"])] == "G"
            for i in range(card["n_layers"])]
    ids, mask = padded(PROMPTS, 0)
    assert_padded_logits_match(ours, model, ids, mask, ATOL)


def test_quantized_fused_experts_are_split_with_their_blocks(tmp_path: Path) -> None:
    """Q8_0 experts: each expert's matrix is gguf's dequantize of its slice, the folder keeps
    each expert's own rows of blocks, and transformers given the dequantized weights agrees."""
    model = hf_model("qwen3moe")
    held = write_gguf(model, tmp_path / "tiny.gguf", "qwen3moe", quantized=("_exps",))
    with torch.no_grad():  # the reference computes with what the file holds
        for index, layer in enumerate(model.model.layers):
            gate, up = (torch.from_numpy(held[f"blk.{index}.ffn_{p}_exps.weight"])
                        for p in ("gate", "up"))
            layer.mlp.experts.gate_up_proj.copy_(torch.cat([gate, up], dim=1))
            layer.mlp.experts.down_proj.copy_(
                torch.from_numpy(held[f"blk.{index}.ffn_down_exps.weight"]))
    ours, _ = imported(tmp_path / "tiny.gguf", tmp_path / "out")
    expert = ours.state_dict()["layers.1.feed_forward.experts.3.down.weight"]
    np.testing.assert_array_equal(expert.numpy(), held["blk.1.ffn_down_exps.weight"][3])
    index = json.loads((tmp_path / "out" / "gguf_blocks.json").read_text())
    entry = index["layers.1.feed_forward.experts.3.down.weight"]
    assert (entry["type"], entry["shape"], entry["gguf"]) == (
        "Q8_0", [32, 32], "blk.1.ffn_down_exps.weight")
    assert len([name for name in index if ".experts." in name]) == 2 * 4 * 3
    from safetensors.numpy import load_file

    raw = load_file(str(tmp_path / "out" / "gguf_blocks.safetensors"))
    np.testing.assert_array_equal(  # expert 3's own rows of blocks, not another's
        gguf.quants.dequantize(raw["layers.1.feed_forward.experts.3.down.weight"],
                               gguf.GGMLQuantizationType.Q8_0),
        held["blk.1.ffn_down_exps.weight"][3])
    ids, mask = padded(PROMPTS, 0)
    assert_padded_logits_match(ours, model, ids, mask, ATOL)


@pytest.mark.parametrize("kind, extra, message", [
    ("qwen3moe", {"qwen3moe.expert_shared_feed_forward_length": 64.0},
     "qwen3moe.expert_shared_feed_forward_length is set"),
    ("olmoe", {"olmoe.expert_gating_func": 2.0}, "olmoe.expert_gating_func is set"),
    ("gemma3", {"gemma3.attn_logit_softcapping": 50.0}, "gemma3.attn_logit_softcapping is set"),
    ("gemma2", {"gemma2.rope.scaling.type": "linear"}, "gemma2.rope.scaling.type is set"),
    ("gemma3-older", {"gemma3.rope.scaling.type": "yarn", "gemma3.rope.scaling.factor": 4.0},
     "gemma3.rope.scaling.type='yarn' with gemma3.rope.scaling.factor=4.0: the zoo reads "
     "linear with a factor"),
])
def test_what_llama_cpp_computes_otherwise_is_refused_by_its_key(
        tmp_path: Path, kind: str, extra: dict, message: str) -> None:
    write_gguf(hf_model(kind), tmp_path / "tiny.gguf", kind, extra)
    result = CliRunner().invoke(cli.main, ["import", str(tmp_path / "tiny.gguf"), "-o",
                                           str(tmp_path / "out")])
    assert_one_line_error(result, "tiny.gguf", message)
    assert not (tmp_path / "out").exists()


def test_a_llama_file_with_experts_but_no_used_count_is_refused_by_the_key(
        tmp_path: Path) -> None:
    model = hf_model("mixtral")
    path = tmp_path / "tiny.gguf"
    write_gguf(model, path, "mixtral")
    data = path.read_bytes()  # the same length: the key renamed, offsets stay right
    path.write_bytes(data.replace(b"llama.expert_used_count", b"llama.expert_xxxx_count"))
    result = CliRunner().invoke(cli.main, ["import", str(path), "-o", str(tmp_path / "out")])
    assert_one_line_error(result, "tiny.gguf", "no llama.expert_used_count (the "
                                               "n_experts_per_token of the model)")


@pytest.mark.parametrize("architecture, published", [
    # transformers' published configs: layers, hidden_size, heads, head_dim, the query scalar
    ("gemma2", (46, 4608, 32, 128, 144)),   # gemma-2-27b: hidden_size / heads, not head_dim
    ("gemma2", (42, 3584, 16, 256, 256)),   # gemma-2-9b
    ("gemma3", (62, 5376, 32, 128, 168)),   # gemma-3-27b
    ("gemma3", (48, 3840, 16, 256, 256)),   # gemma-3-12b
])
def test_the_query_scale_is_llama_cpps_by_layer_count(architecture: str,
                                                      published: tuple) -> None:
    """llama.cpp scales a Gemma 27B's queries by (n_embd / n_head)^-0.5, which it tells by the
    layer count, others' by key_length^-0.5: each is the published query_pre_attn_scalar."""
    from registry.layouts import gguf_maps
    from zoo.files.gguf_import import card_fields

    layers, width, heads, head_dim, scalar = published
    keys = {"block_count": layers, "context_length": 8192, "embedding_length": width,
            "feed_forward_length": 4 * width, "attention.head_count": heads,
            "attention.head_count_kv": heads // 2, "attention.key_length": head_dim,
            "attention.layer_norm_rms_epsilon": 1e-6, "rope.freq_base": 1e6,
            "attention.sliding_window": 4096}
    found = card_fields(gguf_maps()[architecture], {
        "general.architecture": architecture,
        **{f"{architecture}.{key}": value for key, value in keys.items()}}, "x.gguf")
    assert (found["query_pre_attn_scalar"], found["head_dim"]) == (scalar, head_dim)


def test_the_new_sections_keys_and_names_are_llama_cpps() -> None:
    """Every key the Gemma and expert sections read or refuse is one gguf's writer writes, and
    every tensor llama.cpp gives those architectures is named by the section (Mixtral's:
    Llama's tensors with the experts')."""
    from registry.layouts import gguf_maps, gguf_variants

    every = {gguf.TENSOR_NAMES[t] for ts in gguf.MODEL_TENSORS.values() for t in ts}
    written = {value.removeprefix("{arch}.") for group in (
        gguf.Keys.LLM, gguf.Keys.Attention, gguf.Keys.Rope) for value in vars(group).values()
        if isinstance(value, str)}
    sections = {name: gguf_maps()[name] for name in ("gemma2", "gemma3", "qwen3moe", "olmoe")}
    sections["mixtral"] = gguf_variants("llama")[0]
    assert [m.data["model_type"] for m in gguf_variants("llama")] == ["mixtral"]
    for name, layout in sections.items():
        section = layout.gguf
        keys = [*section.config.values(), *section.optional.values(), *section.refused,
                *([section.when] if section.when else [])]
        assert set(keys) <= written, (name, set(keys) - written)
        ours = {rule.source.replace("{i}", "{bid}").rsplit(".", 1)[0] for rule in section.rules}
        arch = next(a for a, n in gguf.MODEL_ARCH_NAMES.items() if n == section.architecture)
        theirs = {gguf.TENSOR_NAMES[t] for t in gguf.MODEL_TENSORS[arch]}
        theirs -= {"rope_freqs", "blk.{bid}.attn_rot_embd"}  # computed, as Llama's map says
        if section.when:  # `llama` with experts: the dense feed-forward is Llama's section's
            theirs -= {f"blk.{{bid}}.ffn_{part}" for part in ("gate", "up", "down")}
        assert theirs <= ours | {"output"}, (name, theirs - ours)
        assert ours <= every, (name, ours - every)  # Gemma 3's norms in Gemma 2's too


def gemma_vocabulary() -> tuple[list[str], list[float], list[int]]:
    """A small SentencePiece BPE vocabulary as Gemma's converter stores one: control tokens,
    <unk>, pieces scored best-first by id, a run of spaces as a user-defined token (Gemma's
    whitespace pieces), and the 256 byte pieces its byte fallback needs."""
    words = ["\u2581", *"abcdehlorw", "\u2581h", "\u2581w", "he", "ll", "lo", "hel", "hell",
             "hello", "\u2581hello", "or", "wor", "worl", "world", "\u2581world"]
    tokens = ["<pad>", "<eos>", "<bos>", "<unk>", "  ", *words, "\n",  # spaces early, as Gemma's
              *(f"<0x{byte:02X}>" for byte in range(256))]
    kinds = [3, 3, 3, 2, 4, *[1] * len(words), 1, *[6] * 256]  # llama.cpp's token types
    scores = [-float(index) if kind == 1 else 0.0 for index, kind in enumerate(kinds)]
    return tokens, scores, kinds


@pytest.mark.parametrize("kind", ["gemma2", "gemma3-older"])
def test_gemmas_sentencepiece_vocabulary_gives_transformers_ids(tmp_path: Path,
                                                                kind: str) -> None:
    """No space before the text (the converter's add_space_prefix false), BOS first, a run of
    spaces as its own token and bytes for a character no piece has: the ids transformers'
    Gemma tokenizer gives from the same file."""
    tokens, scores, kinds = gemma_vocabulary()
    _, config_class, model_class, own = CASES[kind]
    config = getattr(transformers, config_class)(**SIZES | own | {"vocab_size": len(tokens)})
    model = getattr(transformers, model_class)(config).eval()
    path = tmp_path / "tiny.gguf"
    writer = gguf.GGUFWriter(str(path), CASES[kind][0])
    writer.add_tokenizer_model("llama")
    writer.add_token_list(tokens)
    writer.add_token_scores(scores)
    writer.add_token_types(kinds)
    writer.add_unk_token_id(3)
    writer.add_add_space_prefix(False)
    metadata(writer, kind, config)
    for name, array in converted(model, kind).items():
        writer.add_tensor(name, array)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    result = CliRunner().invoke(cli.main, ["import", str(path), "-o", str(tmp_path / "out")])
    assert result.exit_code == 0, result.output
    assert "SentencePiece BPE" in result.output
    from tokenizers import Tokenizer

    ours = Tokenizer.from_file(str(tmp_path / "out" / "tokenizer.json"))
    reference = transformers.AutoTokenizer.from_pretrained(tmp_path, gguf_file="tiny.gguf")
    texts = ["hello world", " hello", "hello  world\n", "world\n\nhello caf\u00e9", "wow"]
    for text in texts:
        ids = ours.encode(text).ids
        assert ids == reference(text).input_ids, text
        assert ids[0] == 2 and tokens[ids[1]] != "\u2581"  # BOS, no space put before the text
        assert ours.decode(ids, skip_special_tokens=True) == text
