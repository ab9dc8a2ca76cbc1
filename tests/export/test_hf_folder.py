"""An export is also a Hugging Face model folder: config.json says what transformers itself reads
as the card's sizes and class (transformers' own config classes are the reference), a card no
transformers layout computes gets no config.json and a line saying so, and the manifest's
sha256 covers every file, the nested ones (onnx/, 1_Pooling/) included."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import onnx
import pytest
from click.testing import CliRunner

from cli import main as zoo
from export.targets.huggingface import transformers_js_dtype
from registry.sizes import attention_sizes
from runtime.contract import MANIFEST
from tests.conftest import ON_HF_CLIENTS, Lazy, card
from tests.support.contract_doc import documented_axes
from tests.support.hf_exports import MODELS
from zoo.files.hf_config import hf_config

CARDS = {  # card: (overrides, the transformers class config.json must name, or None)
    "gpt-tiny": ({}, "GPT2LMHeadModel"),
    "gpt2-small": ({}, "GPT2LMHeadModel"),
    "llama-tiny": ({}, "LlamaForCausalLM"),
    "smollm2-135m": ({}, "LlamaForCausalLM"),
    "qwen2.5-0.5b": ({}, "Qwen2ForCausalLM"),
    "qwen3-0.6b": ({}, "Qwen3ForCausalLM"),
    "bert-tiny": ({"pooling": "mean"}, "BertForMaskedLM"),
    "bert-base": ({"mlm_head": False}, "BertModel"),
}


@pytest.mark.parametrize("name", CARDS)
def test_config_json_is_read_by_transformers_as_the_cards_sizes(name: str) -> None:
    from transformers import AutoConfig

    overrides, architecture = CARDS[name]
    tiny = card(name, **overrides)
    written = hf_config(tiny).config
    assert written is not None and written["architectures"] == [architecture]
    config = AutoConfig.for_model(**written)
    sizes = attention_sizes(tiny)
    assert (config.hidden_size, config.num_hidden_layers, config.num_attention_heads,
            config.vocab_size) == (tiny["d_model"], tiny["n_layers"], sizes.heads,
                                   tiny["vocab_size"])
    assert getattr(config, "num_key_value_heads", sizes.heads) == sizes.kv_heads
    assert getattr(config, "head_dim", sizes.head_dim) == sizes.head_dim
    assert getattr(config, "max_position_embeddings", None) == tiny["max_positions"]
    assert (config.bos_token_id, config.eos_token_id, config.pad_token_id) == (
        tiny["bos_token_id"], tiny["eos_token_id"], tiny["pad_token_id"])


def test_a_classifier_config_names_its_labels_and_only_a_class_that_computes_it() -> None:
    from transformers import AutoConfig

    labels = ["low", "mid", "high"]
    pooler = hf_config(card("bert-tiny", pooling="pooler", num_labels=3, mlm_head=False,
                            labels=labels))
    config = AutoConfig.for_model(**pooler.config)
    assert config.id2label == dict(enumerate(labels))
    assert config.label2id == {label: i for i, label in enumerate(labels)}
    assert pooler.config["architectures"] == ["BertForSequenceClassification"]
    mean = hf_config(card("bert-tiny", pooling="mean", num_labels=3, mlm_head=False))
    assert "architectures" not in mean.config  # BertForSequenceClassification reads the pooler
    assert "mean-pooled classifier" in mean.note


@pytest.mark.parametrize("name, overrides", [
    ("gpt-tiny", {"position": "rotary"}),      # GPT-2 has learned positions
    ("llama-tiny", {"norm": "layernorm"}),     # Llama's norm is RMSNorm
    ("llama-tiny", {"qk_norm": True, "bias": True}),  # Qwen3 has no o_proj bias
])
def test_a_card_no_transformers_layout_computes_gets_no_config(name: str, overrides: dict
                                                               ) -> None:
    found = hf_config(card(name, **overrides))
    assert found.config is None
    assert found.note.startswith("no config.json")


def test_zoo_export_says_why_there_is_no_config_json(tmp_path: Path) -> None:
    out = tmp_path / "rotary"
    result = CliRunner().invoke(zoo, ["export", "gpt-tiny", "--set", "position=rotary",
                                      "--onnx", "-o", str(out)])
    assert result.exit_code == 0, result.output
    assert "no config.json: the card matches no Hugging Face layout" in result.stderr
    assert not (out / "config.json").exists()
    assert (out / "onnx" / "model.onnx").is_file()


@ON_HF_CLIENTS
def test_the_manifest_covers_every_file_of_the_folder(hf_client_exports: Lazy,
                                                      tmp_path: Path) -> None:
    folder = hf_client_exports["embedder"]
    manifest = json.loads((folder / MANIFEST).read_text())
    on_disk = {p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file()}
    assert set(manifest["files"]) == on_disk - {MANIFEST}
    assert {"onnx/model.onnx", "config.json", "tokenizer.json", "tokenizer_config.json",
            "special_tokens_map.json", "modules.json", "1_Pooling/config.json"} <= on_disk
    changed = Path(shutil.copytree(folder, tmp_path / "changed"))
    (changed / "1_Pooling" / "config.json").write_text("{}")
    result = CliRunner().invoke(zoo, ["parity", str(changed)])
    assert result.exit_code != 0
    assert "1_Pooling/config.json: sha256 does not match" in result.output


@ON_HF_CLIENTS
@pytest.mark.parametrize("key", ["gpt", "llama", "embedder"])
def test_the_graph_axes_carry_the_documented_names(hf_client_exports: Lazy, key: str) -> None:
    """transformers.js makes the empty past from these shapes, filling in only `batch_size`."""
    axes = documented_axes()
    graph = onnx.load(str(hf_client_exports[key] / "onnx" / "model.onnx")).graph
    dims = {value.name: [d.dim_param or d.dim_value for d in value.type.tensor_type.shape.dim]
            for value in graph.input}
    assert dims["input_ids"] == [axes["B"], axes["T"]]
    past = [shape for name, shape in dims.items() if name.startswith("past_key_values.")]
    assert len(past) == (2 * card(MODELS[key][0])["n_layers"] if key != "embedder" else 0)
    for shape in past:
        assert shape[0] == axes["B"] and shape[2] == axes["P"]
    if key != "embedder":
        assert dims["attention_mask"] == [axes["B"], axes["P + T"]]


@pytest.mark.parametrize("graphs, stored_as, dtype", [
    (["onnx/model.onnx"], {}, "fp32"),
    (["onnx/model.onnx"], {"onnx/model.onnx": "onnx/model_q4.onnx"}, "q4"),
    # An encoder-decoder in the seq2seq layout whose int8-dynamic quantized only its encoder:
    # transformers.js's per-file form, keyed by file name without .onnx.
    (["onnx/encoder_model.onnx", "onnx/decoder_model_merged.onnx"],
     {"onnx/encoder_model.onnx": "onnx/encoder_model_quantized.onnx"},
     {"encoder_model": "q8", "decoder_model_merged": "fp32"}),
])
def test_config_json_names_the_dtype_each_client_graph_is_stored_under(
        graphs: list[str], stored_as: dict[str, str], dtype: str | dict[str, str]) -> None:
    assert transformers_js_dtype(graphs, stored_as) == dtype
