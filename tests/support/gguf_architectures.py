"""A GGUF file of each architecture the layout maps name, written as llama.cpp's converter writes
one."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from tests.support.gguf_files import llama_cpp_permute
from tests.support.hf_decoders import randomise

gguf = pytest.importorskip("gguf")
transformers = pytest.importorskip("transformers")
SIZES = dict(vocab_size=96, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
             num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
             rms_norm_eps=1e-6, rope_theta=1000.0, bos_token_id=1, eos_token_id=2)


MODELS = {  # general.architecture llama.cpp writes, transformers' classes, settings of their own
    "qwen2": ("qwen2", "Qwen2Config", "Qwen2ForCausalLM", {"use_sliding_window": False}),
    "qwen3": ("qwen3", "Qwen3Config", "Qwen3ForCausalLM", {"head_dim": 16}),  # not 32 / 4
    "mistral": ("llama", "MistralConfig", "MistralForCausalLM", {"sliding_window": None}),
}


def hf_model(kind: str, tie: bool, vocab_size: int = 96) -> torch.nn.Module:
    _, config_class, model_class, own = MODELS[kind]
    config = getattr(transformers, config_class)(**SIZES | {"vocab_size": vocab_size}, **own,
                                                 tie_word_embeddings=tie)
    torch.manual_seed(0)
    model = getattr(transformers, model_class)(config).eval()
    # biases (Qwen2's q/k/v) and norms (Qwen3's q/k) far from 0 and 1
    return randomise(model, bias_std=0.2, seed=None)


def write_gguf(model: torch.nn.Module, path: Path, architecture: str,
               extra: dict[str, float] | None = None, tokenizer: Any = None,
               split: str | None = None) -> None:
    """`tokenizer` (a byte-level BPE) as llama.cpp stores one, its `split` as tokenizer.ggml.pre."""
    config = model.config
    writer = gguf.GGUFWriter(str(path), architecture)
    if tokenizer is not None:
        spec = json.loads(tokenizer.to_str())
        vocab = sorted(spec["model"]["vocab"].items(), key=lambda item: item[1])
        special = {token["content"] for token in spec["added_tokens"]}
        writer.add_tokenizer_model("gpt2")
        writer.add_tokenizer_pre(split)
        writer.add_token_list([token for token, _ in vocab])
        writer.add_token_merges([" ".join(merge) for merge in spec["model"]["merges"]])
        writer.add_token_types([3 if token in special else 1 for token, _ in vocab])
    writer.add_name(f"tiny {config.model_type}")
    writer.add_block_count(config.num_hidden_layers)
    writer.add_context_length(config.max_position_embeddings)
    writer.add_embedding_length(config.hidden_size)
    writer.add_feed_forward_length(config.intermediate_size)
    writer.add_head_count(config.num_attention_heads)
    writer.add_head_count_kv(config.num_key_value_heads)
    writer.add_rope_freq_base(config.rope_parameters["rope_theta"])
    writer.add_layer_norm_rms_eps(config.rms_norm_eps)
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    writer.add_pad_token_id(0)
    if "head_dim" in MODELS[config.model_type][3]:  # as convert_hf_to_gguf.py: where set
        writer.add_key_length(config.head_dim)
        writer.add_value_length(config.head_dim)
    for key, value in (extra or {}).items():
        writer.add_float32(key, value)
    arch = next(a for a, name in gguf.MODEL_ARCH_NAMES.items() if name == architecture)
    names = gguf.get_tensor_name_map(arch, config.num_hidden_layers)
    heads = {"attn_q": config.num_attention_heads, "attn_k": config.num_key_value_heads}
    for name, tensor in model.state_dict().items():
        if name == "lm_head.weight" and config.tie_word_embeddings:
            continue
        target = names.get_name(name, try_suffixes=(".weight", ".bias"))
        array = tensor.numpy().astype(np.float32)
        kind = target.split(".")[-2]
        if architecture == "llama" and kind in heads:  # LlamaModel.permute, bias too
            array = llama_cpp_permute(array, heads[kind])
        writer.add_tensor(target, array)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
