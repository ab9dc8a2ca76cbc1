"""Checks shared by the tests that import a transformers decoder (Llama family, Gemma, mixtures
of experts) and compare the zoo's model with it."""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from tests.support.helpers import assert_one_line_error, zoo

# --- the table: one row per transformers decoder architecture (and per setting worth its own
# model), checked by tests/imports/test_hf_decoders.py; what is left in a per-architecture file
# (test_import_llama.py, test_gemma.py, test_import_moe.py) is what no other row shares.

# the checks a row can declare (tests/imports/test_hf_decoders.py, one test function each)
CARD = "card"  # the imported card has transformers' settings (and the row's `card` fields)
LAYERS = "layers"  # transformers' parameter count; experts in the layers where it has them
RECORD = "record"  # source.json: the layout map, the card extended, the head tied or carried
LOGITS = "logits"  # transformers' logits on a left-padded batch
GREEDY = "greedy"  # transformers' greedy tokens (generate), in PyTorch
EXPORT = "export"  # each of the row's `exports` passes its parity grid, gives transformers' tokens
REFUSED = "refused"  # each of the row's `refused` config.json changes is refused in one line
EVERY_CHECK = frozenset({CARD, LAYERS, RECORD, LOGITS, GREEDY, EXPORT, REFUSED})

PROMPTS = [[11, 52, 7, 80, 33, 19, 64], [40, 9, 71, 23]]  # two lengths: the second left-padded
CONFIG_LINE = "error: src/config.json: "  # how a refusal of a config.json value starts


@dataclass(frozen=True)
class Decoder:
    """One row: a transformers decoder class, the tiny config of its random model, what the
    import must read that the config does not say by itself, and the checks that apply."""

    id: str
    model: str  # transformers' class: LlamaForCausalLM
    config: dict[str, Any]  # its config class's arguments
    config_class: str = ""  # default: the model class's with Config for ForCausalLM
    layout: str = ""  # registry/maps/LAYOUT.yaml; default: the config's model_type
    extends: str = "llama-tiny"  # the card the layout map extends
    card: dict[str, Any] = field(default_factory=dict)  # card fields the import must set
    experts: tuple[int, ...] = ()  # the layers with experts (transformers' and the zoo's)
    norm_mean: float = 1.0  # randomise's (0 for Gemma's norms: offsets from one)
    prompts: list[list[int]] = field(default_factory=lambda: PROMPTS)
    steps: int = 8  # new tokens generated
    every_step: bool = False  # no eos: every step compared (generation_config's eos dropped)
    exports: tuple[tuple[bool, bool], ...] = ()  # (--optimize, slow) of each export checked
    written_back: tuple[str, ...] = ()  # the export's config.json keys transformers reads back
    genai: str | None = None  # genai_config.json's model type, where checked
    refused: dict[str, tuple[dict[str, Any], list[str]]] = field(default_factory=dict)
    checks: frozenset[str] = EVERY_CHECK

    def config_object(self, **changes: Any) -> Any:
        import transformers

        name = self.config_class or self.model.replace("ForCausalLM", "Config")
        return getattr(transformers, name)(**{**self.config, **changes})

    def reference(self, **changes: Any) -> torch.nn.Module:
        """The random transformers model (seeded: the same weights each time)."""
        import transformers

        model = getattr(transformers, self.model)(self.config_object(**changes))
        return randomise(model, norm_mean=self.norm_mean)


def rows(check: str) -> list[Any]:
    """pytest.param of each row that declares `check`, its id the row's."""
    import pytest

    return [pytest.param(row, id=row.id) for row in DECODERS.values() if check in row.checks]


def saved(row: Decoder, folder: Path) -> tuple[Path, torch.nn.Module]:
    """The row's random transformers model, saved with save_pretrained into `folder`."""
    model = row.reference()
    if row.every_step:
        model.generation_config.eos_token_id = None  # the zoo's loop is told eos itself
    model.save_pretrained(folder)
    return folder, model


# the Llama family: eps and theta off transformers' defaults
LLAMA_SIZES = dict(vocab_size=96, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                   num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                   rms_norm_eps=1e-5)
LLAMA_CARD = dict(rope_theta=500.0, qk_norm=False, rope_scaling=None)
YARN = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 16,
        "beta_fast": 16.0, "beta_slow": 2.0}  # off transformers' defaults (32, 1)
YARN_MSCALE = {**YARN, "mscale": 2.0, "mscale_all_dim": 1.0, "truncate": False}
LLAMA3 = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,  # Llama 3.1's
          "high_freq_factor": 4.0, "original_max_position_embeddings": 16}

# Gemma 3 and Gemma 2, also the clients' Gemma 3 folder (tests/support/decoder_folders.py)
GEMMA_WINDOW = 8
GEMMA_SIZES = dict(vocab_size=96, hidden_size=64, intermediate_size=96, num_hidden_layers=3,
                   num_attention_heads=4, num_key_value_heads=1, head_dim=16,
                   max_position_embeddings=128, rms_norm_eps=1e-5, sliding_window=GEMMA_WINDOW,
                   query_pre_attn_scalar=24, pad_token_id=0, bos_token_id=2, eos_token_id=1,
                   attn_implementation="eager")
GEMMA_CARD = dict(sliding_window=GEMMA_WINDOW, query_pre_attn_scalar=24, norm="rmsnorm_gemma",
                  activation="geglu_tanh", sandwich_norm=True, scale_embeddings=True)
GEMMA_PROMPTS = [[11, 52, 7, 80, 33, 19, 64, 21, 45, 70, 14, 88, 30],  # past the window of 8
                 [40, 9, 71, 23, 5, 66, 12, 57, 90, 31]]

# the mixtures of experts, also the clients' Qwen3-MoE folder
MOE_SIZES = dict(vocab_size=96, hidden_size=32, intermediate_size=40, num_hidden_layers=3,
                 num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                 rms_norm_eps=1e-5, tie_word_embeddings=False)
MOE_CARD = dict(activation="moe", n_experts=4, n_experts_per_token=2)

DECODERS = {row.id: row for row in [
    Decoder("llama", "LlamaForCausalLM", dict(
        **LLAMA_SIZES, rope_theta=500.0, attention_bias=True, mlp_bias=True,
        tie_word_embeddings=False), card=LLAMA_CARD, refused={
            # rope scalings the rotary block does not compute (transformers 4's key, then
            # 5's), or settings the kind it computes would not read
            "rope-scaling-longrope": ({"rope_scaling": {"rope_type": "longrope", "factor": 4.0}},
                                      [CONFIG_LINE,
                                       "rope_scaling rope_type='longrope' is not supported"]),
            "rope-yarn-unread": ({"rope_parameters": {
                "rope_type": "yarn", "factor": 4.0, "rope_theta": 500.0,
                "original_max_position_embeddings": 16, "low_freq_factor": 1.0}},
                [CONFIG_LINE, "rope_parameters has low_freq_factor", "yarn"]),
            "rope-parameters-dynamic": ({"rope_parameters": {
                "rope_type": "dynamic", "factor": 2.0, "rope_theta": 500.0}},
                [CONFIG_LINE, "rope_scaling rope_type='dynamic' is not supported"]),
            "rope-parameters-unread": ({"rope_parameters": {
                "rope_type": "linear", "factor": 2.0, "rope_theta": 500.0,
                "attention_factor": 0.5}},
                [CONFIG_LINE, "rope_parameters has attention_factor", "linear"]),
            "gelu": ({"hidden_act": "gelu"}, [CONFIG_LINE, "hidden_act='gelu' is not supported"]),
        }),
    Decoder("mistral", "MistralForCausalLM", dict(
        **LLAMA_SIZES, rope_theta=500.0, sliding_window=None, tie_word_embeddings=True),
        card=LLAMA_CARD, refused={"sliding-window": ({"sliding_window": 16}, [
            CONFIG_LINE, "sliding_window=16", "max_position_embeddings=64"])}),
    Decoder("qwen2", "Qwen2ForCausalLM", dict(  # q/k/v biases
        **LLAMA_SIZES, rope_theta=500.0, tie_word_embeddings=True, eos_token_id=5),
        card=LLAMA_CARD, refused={"sliding-window": (
            {"use_sliding_window": True, "sliding_window": 16},
            [CONFIG_LINE, "use_sliding_window=True"])}),
    Decoder("qwen3", "Qwen3ForCausalLM", {
        **LLAMA_SIZES, "num_key_value_heads": 1, "rope_theta": 500.0, "head_dim": 12,
        "tie_word_embeddings": False}, card={**LLAMA_CARD, "qk_norm": True},
        exports=((False, False),), refused={
            "sliding-layers": ({"layer_types": ["full_attention", "sliding_attention"]},
                               [CONFIG_LINE, "layer_types has sliding_attention"]),
            # Qwen2-MoE's shared expert is no block of the zoo's
            "experts": ({"model_type": "qwen2_moe", "architectures": ["Qwen2MoeForCausalLM"],
                         "num_experts": 4}, [CONFIG_LINE, "'qwen2_moe'", "not a known layout"]),
        }),
    Decoder("qwen2-rope-yarn", "Qwen2ForCausalLM", dict(
        **LLAMA_SIZES, tie_word_embeddings=True, rope_parameters=dict(rope_theta=500.0, **YARN)),
        layout="qwen2", card={**LLAMA_CARD, "rope_scaling": YARN}),
    Decoder("llama-rope-yarn-mscale", "LlamaForCausalLM", dict(
        **LLAMA_SIZES, tie_word_embeddings=False,
        rope_parameters=dict(rope_theta=500.0, **YARN_MSCALE)),
        card={**LLAMA_CARD, "rope_scaling": YARN_MSCALE}),
    Decoder("llama-rope-llama3", "LlamaForCausalLM", dict(
        **LLAMA_SIZES, tie_word_embeddings=True,
        rope_parameters=dict(rope_theta=500.0, **LLAMA3)),
        card={**LLAMA_CARD, "rope_scaling": LLAMA3}),
    # two local layers to one global, a rope base each, scaled
    Decoder("gemma3", "Gemma3ForCausalLM", dict(
        **GEMMA_SIZES, layer_types=["sliding_attention", "sliding_attention", "full_attention"],
        rope_parameters={"full_attention": {"rope_type": "linear", "factor": 4.0,
                                            "rope_theta": 5000.0},
                         "sliding_attention": {"rope_type": "default", "rope_theta": 300.0}}),
        config_class="Gemma3TextConfig", layout="gemma3", extends="gemma-tiny", card=dict(
            **GEMMA_CARD, attention_pattern="LLG", qk_norm=True, rope_theta=5000.0,
            rope_theta_local=300.0, rope_scaling={"rope_type": "linear", "factor": 4.0},
            attn_logit_softcapping=None, final_logit_softcapping=None),
        norm_mean=0.0, prompts=GEMMA_PROMPTS, steps=60, every_step=True,
        # plain slow: qwen3's plain export and the clients' Gemma 3 import run that graph
        exports=((False, True), (True, False)), genai="gemma3_text",
        written_back=("layer_types", "sliding_window", "query_pre_attn_scalar",
                      "rope_parameters"), refused={
            "bidirectional": ({"use_bidirectional_attention": True},
                              [CONFIG_LINE, "use_bidirectional_attention=True"]),
            "layer-kind": ({"layer_types": ["chunked_attention"] * 3},
                           [CONFIG_LINE, "layer_types=['chunked_attention'",
                            "sliding_attention, full_attention"]),
            "local-rope-scaled": ({"rope_parameters": {
                "full_attention": {"rope_type": "default", "rope_theta": 5000.0},
                "sliding_attention": {"rope_type": "linear", "factor": 2.0,
                                      "rope_theta": 300.0}}},
                [CONFIG_LINE, "rope_parameters.sliding_attention has rope_type='linear'"]),
        }),
    # local and global alternating, caps low enough to bite
    Decoder("gemma2", "Gemma2ForCausalLM", dict(
        **GEMMA_SIZES, rope_parameters={"rope_type": "default", "rope_theta": 500.0},
        attn_logit_softcapping=2.0, final_logit_softcapping=3.0), extends="gemma-tiny",
        card=dict(**GEMMA_CARD, attention_pattern="LG", qk_norm=False, rope_theta=500.0,
                  rope_theta_local=None, rope_scaling=None, attn_logit_softcapping=2.0,
                  final_logit_softcapping=3.0),
        norm_mean=0.0, prompts=GEMMA_PROMPTS, steps=60, every_step=True,
        exports=((True, False), (False, True)),  # plain: its caps are plain Tanh nodes (slow)
        refused={"activation": ({"hidden_activation": "relu"},
                                [CONFIG_LINE, "hidden_activation='relu' is not supported"])}),
    # layer 0 dense (mlp_only_layers), 1 and 2 sparse; renormalised top-k
    Decoder("qwen3_moe", "Qwen3MoeForCausalLM", dict(
        **MOE_SIZES, num_experts=4, num_experts_per_tok=2, head_dim=12,
        moe_intermediate_size=24, mlp_only_layers=[0], norm_topk_prob=True),
        card=dict(**MOE_CARD, norm_topk_prob=True, qk_norm_scope="head"), experts=(1, 2),
        exports=((False, True),), refused={
            "gelu": ({"hidden_act": "gelu"},
                     ["src/config.json", "hidden_act='gelu' is not supported"]),
            "qwen2-moe-shared-expert": ({"model_type": "qwen2_moe",
                                         "architectures": ["Qwen2MoeForCausalLM"]},
                                        ["'qwen2_moe'", "not a known layout"])}),
    # every second layer sparse (decoder_sparse_step): only layer 1; top-k as the softmax gave
    Decoder("qwen3_moe-step", "Qwen3MoeForCausalLM", dict(
        **MOE_SIZES, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=24,
        decoder_sparse_step=2, norm_topk_prob=False), layout="qwen3_moe",
        card=dict(**MOE_CARD, norm_topk_prob=False, qk_norm_scope="head"), experts=(1,)),
    # q_norm and k_norm over the whole projections; top-k not renormalised
    # (2 heads of 16: GroupQueryAttention's CPU kernel takes head sizes of 16s)
    Decoder("olmoe", "OlmoeForCausalLM", {
        **MOE_SIZES, "num_experts": 4, "num_experts_per_tok": 2, "eos_token_id": 5,
        "pad_token_id": 0, "num_attention_heads": 2, "num_key_value_heads": 1},
        card=dict(**MOE_CARD, norm_topk_prob=False, qk_norm_scope="projection"),
        # its export slow, as mixtral's and qwen3_moe's: ONNX Runtime's MoE runs moe-tiny's
        # optimized export in tests/export/test_moe_export.py, and the clients run Qwen3-MoE's
        experts=(0, 1, 2), exports=((True, True),), refused={
            "clip-qkv": ({"clip_qkv": 8.0}, ["src/config.json", "clip_qkv=8.0 (needs None)"])}),
    # softmax over the top-k logits
    Decoder("mixtral", "MixtralForCausalLM", {
        **MOE_SIZES, "num_local_experts": 4, "num_experts_per_tok": 2, "sliding_window": None,
        "num_attention_heads": 2, "num_key_value_heads": 1},
        card=dict(**MOE_CARD, norm_topk_prob=True, qk_norm_scope="head"), experts=(0, 1, 2),
        exports=((True, True),), refused={"top-k-above-experts": (
            {"num_experts_per_tok": 5}, ["n_experts_per_token=5 should be <= n_experts=4"])}),
]}


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
