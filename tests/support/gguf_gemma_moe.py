"""GGUF files of Gemma 2, Gemma 3 and the mixtures of experts as llama.cpp's convert_hf_to_gguf.py
writes them."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch

from tests.support.gguf_files import llama_cpp_permute

gguf = pytest.importorskip("gguf")
SIZES = dict(vocab_size=96, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
             num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
             rms_norm_eps=1e-6, pad_token_id=0, bos_token_id=2, eos_token_id=1,
             attn_implementation="eager")


GEMMA = dict(head_dim=16, query_pre_attn_scalar=16, sliding_window=8)  # llama.cpp: key_length's
EXPERTS = dict(num_experts_per_tok=2)
CASES: dict[str, tuple[str, str, str, dict[str, Any]]] = {
    # general.architecture, transformers' config and model classes, their settings
    "gemma2": ("gemma2", "Gemma2Config", "Gemma2ForCausalLM", dict(  # caps low enough to bite;
        **GEMMA, attn_logit_softcapping=2.0, final_logit_softcapping=3.0)),  # base 10000
    "gemma3": ("gemma3", "Gemma3TextConfig", "Gemma3ForCausalLM", dict(  # five local, one global
        **GEMMA, num_hidden_layers=7, rope_parameters={
            "full_attention": {"rope_type": "linear", "factor": 4.0, "rope_theta": 5000.0},
            "sliding_attention": {"rope_type": "default", "rope_theta": 300.0}})),
    "gemma3-older": ("gemma3", "Gemma3TextConfig", "Gemma3ForCausalLM", dict(  # no base_swa
        **GEMMA, num_hidden_layers=6, final_logit_softcapping=4.0, rope_parameters={
            "full_attention": {"rope_type": "default", "rope_theta": 5000.0},
            "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0}})),
    "qwen3moe": ("qwen3moe", "Qwen3MoeConfig", "Qwen3MoeForCausalLM", dict(
        **EXPERTS, num_experts=4, moe_intermediate_size=32, head_dim=16, norm_topk_prob=True,
        rope_theta=1000.0)),
    "olmoe": ("olmoe", "OlmoeConfig", "OlmoeForCausalLM", dict(
        **EXPERTS, num_experts=4, norm_topk_prob=False, rms_norm_eps=1e-5, rope_theta=1000.0)),
    "mixtral": ("llama", "MixtralConfig", "MixtralForCausalLM", dict(
        **EXPERTS, num_local_experts=4, sliding_window=None, rope_theta=1000.0)),
}


def metadata(writer: Any, kind: str, config: Any) -> None:
    """The keys convert_hf_to_gguf.py writes for this architecture (Gemma2Model: no rope base,
    its caps and window; Gemma3Model: the global base, the window, a linear scaling and, in
    newer converters, the local base; the experts' counts and an expert's inner size)."""
    writer.add_name(f"tiny {kind}")
    writer.add_block_count(config.num_hidden_layers)
    writer.add_context_length(config.max_position_embeddings)
    writer.add_embedding_length(config.hidden_size)
    writer.add_feed_forward_length(config.intermediate_size)
    writer.add_head_count(config.num_attention_heads)
    writer.add_head_count_kv(config.num_key_value_heads)
    writer.add_layer_norm_rms_eps(config.rms_norm_eps)
    writer.add_bos_token_id(2)
    writer.add_eos_token_id(1)
    writer.add_pad_token_id(0)
    if hasattr(config, "head_dim") and kind != "mixtral":
        writer.add_key_length(config.head_dim)
        writer.add_value_length(config.head_dim)
    rope = config.rope_parameters
    if kind == "gemma2":
        writer.add_attn_logit_softcapping(config.attn_logit_softcapping)
        writer.add_final_logit_softcapping(config.final_logit_softcapping)
        writer.add_sliding_window(config.sliding_window)
    elif kind.startswith("gemma3"):
        writer.add_rope_freq_base(rope["full_attention"]["rope_theta"])
        writer.add_sliding_window(config.sliding_window)
        if config.final_logit_softcapping:
            writer.add_final_logit_softcapping(config.final_logit_softcapping)
        if rope["full_attention"]["rope_type"] == "linear":
            writer.add_rope_scaling_type(gguf.RopeScalingType.LINEAR)
            writer.add_rope_scaling_factor(rope["full_attention"]["factor"])
        if kind == "gemma3":
            writer.add_rope_freq_base_swa(rope["sliding_attention"]["rope_theta"])
    else:
        writer.add_rope_freq_base(rope["rope_theta"])
        writer.add_expert_count(getattr(config, "num_experts", None)
                                or config.num_local_experts)
        writer.add_expert_used_count(config.num_experts_per_tok)
        if kind == "qwen3moe":
            writer.add_expert_feed_forward_length(config.moe_intermediate_size)


def converted(model: torch.nn.Module, kind: str) -> dict[str, np.ndarray]:
    """{llama.cpp's name: array} as the converter writes them: Gemma's norms plus one, each
    layer's experts stacked (transformers holds gate and up fused, gate first), Llama's query and
    key rows reordered (Mixtral), no head where it is tied."""
    config, architecture = model.config, CASES[kind][0]
    arch = next(a for a, name in gguf.MODEL_ARCH_NAMES.items() if name == architecture)
    names = gguf.get_tensor_name_map(arch, config.num_hidden_layers)
    heads = {"attn_q": config.num_attention_heads, "attn_k": config.num_key_value_heads}
    found = {}
    for name, tensor in model.state_dict().items():
        if name == "lm_head.weight" and config.tie_word_embeddings:
            continue
        array = tensor.numpy().astype(np.float32)
        parts = {name: array}
        if name.endswith("experts.gate_up_proj"):
            gate, up = np.split(array, 2, axis=1)
            stem = name.removesuffix("gate_up_proj")
            parts = {stem + "gate_proj": gate, stem + "up_proj": up}
        for part, value in parts.items():
            target = names.get_name(part, try_suffixes=(".weight", ".bias"))
            target = target if target.endswith((".weight", ".bias")) else target + ".weight"
            if "gemma" in kind and name.endswith("norm.weight"):  # Gemma's RMSNorm: 1 + w
                value = value + 1.0
            if architecture == "llama" and target.split(".")[-2] in heads:
                value = llama_cpp_permute(value, heads[target.split(".")[-2]])
            found[target] = value
    return found
