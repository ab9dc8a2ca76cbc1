"""A GGUF file of each architecture the layout maps name (registry/maps/*.yaml `gguf`), written
here as llama.cpp's converter writes one: tensor names from the gguf package's own table
(gguf.get_tensor_name_map, llama.cpp's convert_hf_to_gguf.py reads the same), metadata keys
from its writer, query and key rows reordered for Llama's layout only (Mistral's files say
`llama`; Qwen's rotary is in halves, which llama.cpp keeps). The imported model must give the
logits of the tiny transformers model the file came from. Also: the maps' keys and names are
llama.cpp's, and genai_config.json's type is the map's."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path
from typing import Any

import pytest
import torch
from click.testing import CliRunner

import cli
from tests.conftest import card
from tests.support.gguf_architectures import MODELS, hf_model, write_gguf
from tests.support.helpers import assert_one_line_error
from zoo.files.weights import load_built

gguf = pytest.importorskip("gguf")
transformers = pytest.importorskip("transformers")


def imported(path: Path, out: Path) -> Any:
    result = CliRunner().invoke(cli.main, ["import", str(path), "-o", str(out)])
    assert result.exit_code == 0, result.output
    return result


@pytest.mark.parametrize("tie", [True, False], ids=["tied", "untied"])
@pytest.mark.parametrize("kind", list(MODELS))
def test_a_gguf_file_of_each_mapped_architecture_gives_transformers_logits(
        tmp_path: Path, kind: str, tie: bool) -> None:
    model = hf_model(kind, tie)
    write_gguf(model, tmp_path / "tiny.gguf", MODELS[kind][0])
    imported(tmp_path / "tiny.gguf", tmp_path / "out")
    ours, made = load_built(tmp_path / "out")
    assert (made["n_kv_heads"], made["tie_embeddings"], made["rope_theta"]) == (2, tie, 1000.0)
    ids = torch.tensor([[1, 5, 9, 14, 30, 41, 7], [1, 60, 3, 3, 8, 12, 90]])
    with torch.no_grad():
        expected = model(ids).logits
        logits, _ = ours(ids)
    assert expected.abs().max() > 1.0  # large enough for the tolerance to mean something
    torch.testing.assert_close(logits, expected, atol=1e-4, rtol=1e-4)


def numbers_bpe() -> Any:
    """A byte-level BPE (GPT-2's split) trained here on the shipped text and on numbers, so
    that it merges digits and a space before them ("Ġ1", "99"): split otherwise, a text with
    numbers gets other ids."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    from zoo.training.data import SHIPPED_TEXT

    lines = SHIPPED_TEXT.read_text(encoding="utf-8").splitlines()[:2000]
    lines += [f"In {n}, {n * 37} ROMEO'S {n % 97} I'M" for n in range(1500)]
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=400, special_tokens=["<|end|>", "<|start|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tokenizer.train_from_iterator(lines, trainer)
    return tokenizer


@pytest.mark.parametrize("kind, split", [("qwen2", "qwen2"), ("qwen3", "qwen2"),
                                         ("mistral", "llama-bpe")])
def test_the_files_byte_level_bpe_is_split_as_its_pre_tokenizer_says(
        tmp_path: Path, kind: str, split: str) -> None:
    """Qwen's files split one digit a piece, Llama 3's up to three (tokenizer.ggml.pre), before
    the merges: the converted tokenizer gives transformers' ids from the same file."""
    from tokenizers import Tokenizer

    bpe = numbers_bpe()
    write_gguf(hf_model(kind, True, bpe.get_vocab_size()), tmp_path / "tiny.gguf",
               MODELS[kind][0], tokenizer=bpe, split=split)
    assert "byte-level BPE" in imported(tmp_path / "tiny.gguf", tmp_path / "out").output
    ours = Tokenizer.from_file(str(tmp_path / "out" / "tokenizer.json"))
    reference = transformers.AutoTokenizer.from_pretrained(tmp_path, gguf_file="tiny.gguf")
    texts = ["In 1599, 12345678 citizens", "I'M here; WE'LL go", "café 東京 3.14159\n\n x",
             "<|start|>ROMEO: 42<|end|>"]
    for text in texts:
        assert ours.encode(text).ids == reference.backend_tokenizer.encode(text).ids, text
        assert ours.decode(ours.encode(text).ids, skip_special_tokens=False) == text
    pieces = [piece for piece, _ in ours.pre_tokenizer.pre_tokenize_str(" 12345678")]
    assert pieces == (["Ġ", *"12345678"] if split == "qwen2" else ["Ġ", "123", "456", "78"])


def test_an_architecture_no_map_names_is_refused_by_name(tmp_path: Path) -> None:
    model = hf_model("qwen2", True)
    write_gguf(model, tmp_path / "tiny.gguf", "qwen2")
    data = (tmp_path / "tiny.gguf").read_bytes()  # the same length: offsets stay right
    (tmp_path / "other.gguf").write_bytes(data.replace(b"qwen2", b"qwen9"))
    result = CliRunner().invoke(cli.main, ["import", str(tmp_path / "other.gguf"), "-o",
                                           str(tmp_path / "out")])
    assert_one_line_error(result, "other.gguf", "general.architecture='qwen9' is not imported "
                                           "(known: llama, gemma2, gemma3, olmoe, "
                                           "qwen2, qwen3, qwen3moe)")
    assert not (tmp_path / "out").exists()


def test_a_sliding_window_is_refused_under_the_files_architecture(tmp_path: Path) -> None:
    write_gguf(hf_model("qwen2", True), tmp_path / "tiny.gguf", "qwen2",
               {"qwen2.attention.sliding_window": 16.0})
    result = CliRunner().invoke(cli.main, ["import", str(tmp_path / "tiny.gguf"), "-o",
                                           str(tmp_path / "out")])
    assert_one_line_error(result, "tiny.gguf", "qwen2.attention.sliding_window is set")


def test_a_tensor_the_cards_model_lacks_is_refused_by_its_gguf_name(tmp_path: Path) -> None:
    """Qwen2's query/key/value biases in a file that says `llama` (whose map's card has none)."""
    write_gguf(hf_model("qwen2", True), tmp_path / "tiny.gguf", "llama")
    result = CliRunner().invoke(cli.main, ["import", str(tmp_path / "tiny.gguf"), "-o",
                                           str(tmp_path / "out")])
    assert_one_line_error(result, "tiny.gguf", "no place in the card's model: blk.0.attn_k.bias, "
                                          "blk.0.attn_q.bias, blk.0.attn_v.bias")


def test_the_maps_gguf_keys_and_names_are_llama_cpps() -> None:
    """Every metadata key a map reads is one gguf's writer writes; the dense tensors llama.cpp
    gives each architecture are each named by its map, and a name of the map's that the
    architecture lacks is another's (Qwen3's norms, which Llama's section carries)."""
    from registry.layouts import gguf_maps

    written = {value for group in (gguf.Keys.LLM, gguf.Keys.Attention, gguf.Keys.Rope)
               for value in vars(group).values() if isinstance(value, str)}
    every = {gguf.TENSOR_NAMES[t] for ts in gguf.MODEL_TENSORS.values() for t in ts}
    extras = {"rope_freqs", "blk.{bid}.attn_rot_embd", "blk.{bid}.ffn_gate_inp",
              "blk.{bid}.ffn_gate_exps", "blk.{bid}.ffn_down_exps", "blk.{bid}.ffn_up_exps"}
    layouts = gguf_maps()
    assert sorted(layouts) == ["gemma2", "gemma3", "llama", "olmoe", "qwen2", "qwen3", "qwen3moe"]
    for architecture, layout in layouts.items():
        if architecture not in ("llama", "qwen2", "qwen3"):
            continue  # Gemma's and the experts' sections: tests/gguf/test_gguf_gemma_moe.py
        section = layout.gguf
        for key in [*section.config.values(), *section.optional.values()]:
            assert f"{{arch}}.{key}" in written, (architecture, key)
        ours = {rule.source.replace("{i}", "{bid}").rsplit(".", 1)[0] for rule in section.rules}
        arch = next(a for a, name in gguf.MODEL_ARCH_NAMES.items() if name == architecture)
        theirs = {gguf.TENSOR_NAMES[t] for t in gguf.MODEL_TENSORS[arch]} - extras
        assert theirs <= ours, (architecture, theirs - ours)
        assert ours <= every, (architecture, ours - every)


def test_genai_configs_type_is_the_maps(tmp_path: Path, monkeypatch: pytest.MonkeyPatch
                                        ) -> None:
    """The type is the `genai` of the map that reproduces the card (GenAI's own names for
    these layouts), not a guess from the card's fields: a map that says another type moves
    the config with it; a card no map reproduces gets GenAI's generic decoder."""
    import registry.layouts
    from export.targets.genai import model_type

    cards = {"llama": card("llama-tiny"), "qwen2": card("llama-tiny", attention_bias=True),
             "qwen3": card("llama-tiny", qk_norm=True, head_dim=16),
             "decoder": card("gpt-tiny"), "none": card("llama-tiny", pooling="mean")}
    assert {name: model_type(c) for name, c in cards.items()} == {
        "llama": "llama", "qwen2": "qwen2", "qwen3": "qwen3", "decoder": "decoder",
        "none": "decoder"}
    maps = tmp_path / "maps"
    shutil.copytree(registry.layouts.MAPS, maps)
    text = (maps / "qwen2.yaml").read_text(encoding="utf-8")
    (maps / "qwen2.yaml").write_text(text.replace("genai: qwen2", "genai: mistral"),
                                     encoding="utf-8")
    monkeypatch.setattr(registry.layouts, "MAPS", maps)
    assert model_type(cards["qwen2"]) == "mistral"
    assert model_type(cards["llama"]) == "llama"


@pytest.mark.parametrize("section, message", [
    ({"architecture": "qwen2"}, "gguf: needs architecture, config, tensors"),
    ({"permuted": {"blk.{i}.attn_x.{p}": "heads"}}, "blk.{i}.attn_x.{p}: heads should name"),
    ({"permuted": {"blk.{i}.attn_q.{p}": "groups"}}, "groups should name one of its tensors"),
    ({"fields": ["rope_theta"]}, "gguf: fields should be a mapping"),
    ({"refused": "expert_count"}, "gguf: refused should be a list"),
    ({"when": ["expert_count"]}, "gguf: when should name one key of the file"),
    ({"shifted": {"output_norm.weight": "one"}}, "shifted should map some of its tensors"),
])
def test_a_malformed_gguf_section_is_one_line(tmp_path: Path, section: dict, message: str
                                              ) -> None:
    import yaml

    import registry.layouts
    from registry.errors import ZooError

    maps = tmp_path / "maps"
    shutil.copytree(registry.layouts.MAPS, maps)
    data = yaml.safe_load((maps / "llama.yaml").read_text(encoding="utf-8"))
    data["gguf"] = section if "architecture" in section and len(section) == 1 else (
        data["gguf"] | section)
    (maps / "llama.yaml").write_text(yaml.safe_dump(data), encoding="utf-8")
    with pytest.raises(ZooError, match=r"^\S*llama.yaml: " + ".*" + re.escape(message)):
        registry.layouts.LayoutMap(maps / "llama.yaml")


# qwen2's type is checked without GenAI's loop in test_genai_configs_type_is_the_maps
@pytest.mark.parametrize("kind, genai_type", [
    pytest.param("qwen2", "qwen2", marks=pytest.mark.slow), ("qwen3", "qwen3")])
def test_an_imported_files_export_runs_in_genai_under_its_maps_type(
        tmp_path: Path, kind: str, genai_type: str) -> None:
    """The export of an imported file names the type of the map that reproduces its card,
    and GenAI's loop under that type gives transformers' greedy tokens (Llama's type:
    tests/zoo/test_llama_family.py)."""
    pytest.importorskip("onnxruntime_genai")
    from tests.support.genai import genai_greedy

    model = hf_model(kind, False)
    write_gguf(model, tmp_path / "tiny.gguf", MODELS[kind][0])
    imported(tmp_path / "tiny.gguf", tmp_path / "out")
    result = CliRunner().invoke(cli.main, ["export", str(tmp_path / "out"), "--onnx", "-o",
                                           str(tmp_path / "onnx")])
    assert result.exit_code == 0, result.output
    config = json.loads((tmp_path / "onnx" / "genai_config.json").read_text())["model"]
    assert config["type"] == genai_type
    prompts = [[1, 40, 41, 42, 43], [1, 7, 8]]
    expected = []
    with torch.no_grad():
        for prompt in prompts:
            ids = torch.tensor([prompt])
            tokens = model.generate(ids, max_new_tokens=6, do_sample=False,
                                    eos_token_id=None)[0, ids.shape[1]:].tolist()
            expected.append(tokens[:tokens.index(2) + 1] if 2 in tokens else tokens)
    assert genai_greedy(tmp_path / "onnx", prompts, 6) == expected
