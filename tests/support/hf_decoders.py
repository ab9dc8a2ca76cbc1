"""Checks shared by the tests that import a transformers decoder (Llama family, Gemma, mixtures
of experts) and compare the zoo's model with it."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import torch

from tests.support.helpers import assert_one_line_error, zoo

# Gemma 3 and Gemma 2 (tests/imports/test_gemma.py), also the clients' Gemma 3 folder
GEMMA_WINDOW = 8
GEMMA_SIZES = dict(vocab_size=96, hidden_size=64, intermediate_size=96, num_hidden_layers=3,
             num_attention_heads=4, num_key_value_heads=1, head_dim=16,
             max_position_embeddings=128, rms_norm_eps=1e-5, sliding_window=GEMMA_WINDOW,
             query_pre_attn_scalar=24, pad_token_id=0, bos_token_id=2, eos_token_id=1,
             attn_implementation="eager")
GEMMA_CASES: dict[str, tuple[str, dict[str, Any]]] = {  # transformers' class, its config besides
    "gemma3": ("Gemma3", dict(  # two local layers to one global, a rope base each, scaled
        layer_types=["sliding_attention", "sliding_attention", "full_attention"],
        rope_parameters={"full_attention": {"rope_type": "linear", "factor": 4.0,
                                            "rope_theta": 5000.0},
                         "sliding_attention": {"rope_type": "default", "rope_theta": 300.0}})),
    "gemma2": ("Gemma2", dict(  # local and global alternating, caps low enough to bite
        rope_parameters={"rope_type": "default", "rope_theta": 500.0},
        attn_logit_softcapping=2.0, final_logit_softcapping=3.0)),
}


# the mixtures of experts (tests/imports/test_import_moe.py), also the clients' Qwen3-MoE folder
MOE_SIZES = dict(vocab_size=96, hidden_size=32, intermediate_size=40, num_hidden_layers=3,
             num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
             rms_norm_eps=1e-5, tie_word_embeddings=False)
MOE_CASES: dict[str, tuple[str, dict[str, Any]]] = {  # transformers' class, and its config besides
    # layer 0 dense (mlp_only_layers), 1 and 2 sparse; renormalised top-k
    "qwen3_moe": ("Qwen3Moe", dict(num_experts=4, num_experts_per_tok=2, head_dim=12,
                                   moe_intermediate_size=24, mlp_only_layers=[0],
                                   norm_topk_prob=True)),
    # every second layer sparse (decoder_sparse_step): only layer 1; top-k as the softmax gave
    "qwen3_moe-step": ("Qwen3Moe", dict(num_experts=4, num_experts_per_tok=2,
                                        moe_intermediate_size=24, decoder_sparse_step=2,
                                        norm_topk_prob=False)),
    # q_norm and k_norm over the whole projections; top-k not renormalised
    # (2 heads of 16: GroupQueryAttention's CPU kernel takes head sizes of 16s)
    "olmoe": ("Olmoe", dict(num_experts=4, num_experts_per_tok=2, eos_token_id=5,
                            pad_token_id=0, num_attention_heads=2, num_key_value_heads=1)),
    # softmax over the top-k logits
    "mixtral": ("Mixtral", dict(num_local_experts=4, num_experts_per_tok=2,
                                sliding_window=None, num_attention_heads=2,
                                num_key_value_heads=1)),
}


def assert_padded_logits_match(model: torch.nn.Module, reference: Any, ids: torch.Tensor,
                               mask: torch.Tensor, atol: float) -> None:
    """The zoo's logits equal transformers' on a left-padded batch, at the real tokens (padded
    queries see no key at all: their outputs mean nothing), positions counting real tokens."""
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    with torch.no_grad():
        ours, _ = model(ids, mask, positions)
        theirs = reference(input_ids=ids, attention_mask=mask, position_ids=positions).logits
    real = mask.bool()
    assert theirs[real].abs().max() > 1.0  # logits far from zero, so the tolerance means a lot
    torch.testing.assert_close(ours[real], theirs[real], atol=atol, rtol=0)


def randomise(model: torch.nn.Module, *, std: float = 0.2, norm_mean: float = 1.0,
              norm_std: float = 0.3, bias_std: float = 0.3, seed: int | None = 0
              ) -> torch.nn.Module:
    """Norm weights around `norm_mean` (one; zero for Gemma's, offsets from one), biases around
    zero and weights far from the 0.02 init, so a wrong norm, bias, eps, theta, scale, routing or
    expert shows in the logits. From a generator seeded with `seed`, or with None from torch's
    global generator (where the caller seeded it before building the model)."""
    generator = None if seed is None else torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            mean, spread = ((norm_mean, norm_std) if "norm" in name
                            else (0.0, bias_std if "bias" in name else std))
            parameter.copy_(mean + spread * torch.randn(parameter.shape, generator=generator))
    return model.eval()


def changed_source(source: Path, changes: dict[str, Any], tmp_path: Path) -> Path:
    """A copy of a saved transformers folder as tmp_path/src, its config.json changed."""
    folder = shutil.copytree(source, tmp_path / "src")
    path = folder / "config.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), **changes}))
    return folder


def assert_import_refused(tmp_path: Path, *parts: str) -> None:
    """`zoo import src -o out`, run in tmp_path: one line naming `parts`, and no OUT, no
    staging left."""
    before = sorted(p.name for p in tmp_path.iterdir())
    assert_one_line_error(zoo("import", "src", "-o", "out"), *parts)
    assert sorted(p.name for p in tmp_path.iterdir()) == before
