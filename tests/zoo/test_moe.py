"""The mixture-of-experts feed-forward (`activation: moe`): its parameter counts (total and
active) against transformers' own classes built on the meta device from the published
configurations, its routing against transformers' sparse blocks, which layers stay dense, and
the card's checks."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from registry.errors import CardError
from registry.params import active_parameters, total_parameters
from registry.schema import validate
from tests.conftest import CATALOG
from zoo.assemble import build_model
from zoo.blocks.experts import MixtureOfExperts
from zoo.blocks.feedforward import SwiGLUFeedForward

transformers = pytest.importorskip("transformers")

# The published configurations (config.json on the Hub), written out: no download.
QWEN3_30B_A3B = dict(vocab_size=151936, hidden_size=2048, intermediate_size=6144,
                     moe_intermediate_size=768, num_hidden_layers=48, num_attention_heads=32,
                     num_key_value_heads=4, head_dim=128, num_experts=128,
                     num_experts_per_tok=8, norm_topk_prob=True, decoder_sparse_step=1,
                     mlp_only_layers=[], max_position_embeddings=40960,
                     tie_word_embeddings=False)
OLMOE_1B_7B = dict(vocab_size=50304, hidden_size=2048, intermediate_size=1024,
                   num_hidden_layers=16, num_attention_heads=16, num_key_value_heads=16,
                   num_experts=64, num_experts_per_tok=8, norm_topk_prob=False,
                   max_position_embeddings=4096, tie_word_embeddings=False)
MIXTRAL_8X7B = dict(vocab_size=32000, hidden_size=4096, intermediate_size=14336,
                    num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=8,
                    num_local_experts=8, num_experts_per_tok=2, tie_word_embeddings=False)
# The zoo's card for Mixtral-8x7B (no card ships: the test writes it over llama-tiny)
MIXTRAL_CARD = dict(vocab_size=32000, max_positions=32768, d_model=4096, n_heads=32,
                    n_kv_heads=8, n_layers=32, d_ff=14336, activation="moe", n_experts=8,
                    n_experts_per_token=2, moe_d_ff=14336)


def meta_count(kind: str, settings: dict[str, Any]) -> tuple[int, torch.nn.Module]:
    config = getattr(transformers, f"{kind}Config")(**settings)
    with torch.device("meta"):
        model = getattr(transformers, f"{kind}ForCausalLM")(config)
    return sum(p.numel() for p in model.parameters()), model


def one_expert(model: torch.nn.Module) -> int:
    """An expert's parameters in transformers' model: its first sparse block's experts over
    their number."""
    block = next(m for m in model.modules() if type(m).__name__.endswith("SparseMoeBlock"))
    experts = sum(p.numel() for p in block.experts.parameters())
    return experts // block.experts.num_experts


def llama_tiny(**fields: Any) -> dict[str, Any]:
    return validate({**CATALOG.get("llama-tiny").fields, **fields}, "test.yaml")


@pytest.mark.parametrize("card_name, kind, settings, published", [
    ("qwen3-30b-a3b", "Qwen3Moe", QWEN3_30B_A3B, (30.5e9, 3.3e9)),  # "30.5B, 3.3B activated"
    ("olmoe-1b-7b", "Olmoe", OLMOE_1B_7B, (6.9e9, 1.3e9)),  # "1B active, 7B total": 1.3, 6.9
    (None, "Mixtral", MIXTRAL_8X7B, (46.7e9, 12.9e9)),  # "46.7B total, 12.9B per token"
])
def test_counts_match_transformers_and_the_published_totals(
        card_name: str | None, kind: str, settings: dict, published: tuple[float, float]) -> None:
    card = CATALOG.get(card_name).fields if card_name else llama_tiny(**MIXTRAL_CARD)
    theirs, model = meta_count(kind, settings)
    assert total_parameters(card) == theirs
    layers, k = model.config.num_hidden_layers, model.config.num_experts_per_tok
    experts = getattr(model.config, "num_experts", None) or model.config.num_local_experts
    # every layer is sparse in these three: a token skips n - k experts in each
    assert active_parameters(card) == theirs - layers * (experts - k) * one_expert(model)
    total, active = published
    assert abs(theirs - total) < 0.06e9  # the published figures, rounded
    assert abs(active_parameters(card) - active) < 0.06e9


def test_the_modules_hold_what_the_arithmetic_says() -> None:
    for name in ("moe-tiny", "qwen3-30b-a3b", "olmoe-1b-7b"):
        card = CATALOG.get(name).fields
        model = build_model(card, meta=True)
        assert sum(p.numel() for p in model.parameters()) == total_parameters(card), name


@pytest.mark.parametrize("only, step", [([], 1), ([0, 3], 1), ([], 2), ([1], 3)])
def test_dense_and_sparse_layers_are_transformers(only: list[int], step: int) -> None:
    settings = dict(vocab_size=260, hidden_size=32, intermediate_size=40, num_hidden_layers=6,
                    num_attention_heads=2, num_key_value_heads=1, num_experts=4,
                    num_experts_per_tok=2, moe_intermediate_size=16, mlp_only_layers=only,
                    decoder_sparse_step=step)
    theirs, model = meta_count("Qwen3Moe", settings)
    reference = [hasattr(layer.mlp, "experts") for layer in model.model.layers]
    card = llama_tiny(n_layers=6, d_ff=40, n_heads=2, n_kv_heads=1, d_model=32, vocab_size=260,
                      activation="moe", n_experts=4, n_experts_per_token=2, moe_d_ff=16,
                      mlp_only_layers=only, decoder_sparse_step=step, head_dim=16, qk_norm=True)
    ours = build_model(card, meta=True)
    assert [isinstance(layer.feed_forward, MixtureOfExperts) for layer in ours.layers] == reference
    assert all(isinstance(layer.feed_forward, SwiGLUFeedForward)
               for layer, sparse in zip(ours.layers, reference, strict=True) if not sparse)
    assert total_parameters(card) == theirs == sum(p.numel() for p in ours.parameters())


@pytest.mark.parametrize("kind, normalise", [("Qwen3Moe", True), ("Olmoe", False),
                                             ("Mixtral", True)])
def test_a_sparse_block_computes_transformers_block(kind: str, normalise: bool) -> None:
    """The zoo's block with transformers' block's weights, on tokens of spread-out routing."""
    experts = "num_local_experts" if kind == "Mixtral" else "num_experts"
    extra = {"norm_topk_prob": normalise} if kind != "Mixtral" else {}
    config = getattr(transformers, f"{kind}Config")(
        hidden_size=16, intermediate_size=24, moe_intermediate_size=24, num_experts_per_tok=3,
        **{experts: 6}, **extra)
    module = getattr(transformers.models, kind.lower().replace("qwen3moe", "qwen3_moe"))
    block_class = getattr(getattr(module, f"modeling_{module.__name__.split('.')[-1]}"),
                          f"{kind}SparseMoeBlock")
    torch.manual_seed(0)
    theirs = block_class(config).eval()
    with torch.no_grad():
        for parameter in theirs.parameters():
            parameter.normal_(0, 0.5)
    ours = MixtureOfExperts(16, 24, 6, 3, normalise, 0.0, False).eval()
    state = {"router.weight": theirs.gate.weight}
    for e in range(6):
        gate, up = theirs.experts.gate_up_proj[e].chunk(2, dim=0)
        state |= {f"experts.{e}.gate.weight": gate, f"experts.{e}.up.weight": up,
                  f"experts.{e}.down.weight": theirs.experts.down_proj[e]}
    ours.load_state_dict(state)
    x = torch.randn(2, 5, 16)
    with torch.no_grad():
        expected = theirs(x)
        expected = expected[0] if isinstance(expected, tuple) else expected
        torch.testing.assert_close(ours(x), expected, atol=1e-5, rtol=0)


@pytest.mark.parametrize("fields, message", [
    (dict(n_experts_per_token=5), "n_experts_per_token=5 should be <= n_experts=4"),
    (dict(mlp_only_layers=[2]), "mlp_only_layers=[2] should list layer indices 0..1"),
    (dict(mlp_only_layers=["0"]), "mlp_only_layers=['0'] should list layer indices"),
    (dict(decoder_sparse_step=0), "decoder_sparse_step=0 should be >= 1"),
    (dict(n_experts=None), "n_experts=None should be int"),
])
def test_bad_expert_fields_are_one_line(fields: dict, message: str) -> None:
    card = {**CATALOG.get("moe-tiny").fields, **fields}
    with pytest.raises(CardError, match=message.replace("[", r"\[").replace("]", r"\]")):
        validate(card, "test.yaml")


def test_expert_fields_apply_only_to_the_moe_block() -> None:
    with pytest.raises(CardError, match="n_experts applies only to activation moe, not swiglu"):
        validate({**CATALOG.get("llama-tiny").fields, "n_experts": 4}, "test.yaml")
    with pytest.raises(CardError, match="activation=moe applies only to family decoder"):
        validate({**CATALOG.get("bert-tiny").fields, "activation": "moe", "n_experts": 4,
                  "n_experts_per_token": 2, "moe_d_ff": 8}, "test.yaml")
    with pytest.raises(CardError, match="qk_norm_scope='projection' needs qk_norm: true"):
        validate({**CATALOG.get("llama-tiny").fields, "qk_norm_scope": "projection"},
                 "test.yaml")


def test_zoo_show_gives_the_parameters_active_per_token() -> None:
    from tests.support.helpers import zoo

    shown = zoo("show", "qwen3-30b-a3b")
    assert shown.exit_code == 0, shown.output
    assert "parameters: 30,532,122,624" in shown.stdout
    assert "active per token: 3,353,032,704" in shown.stdout
    dense = zoo("show", "qwen3-0.6b")
    assert "active per token" not in dense.stdout


@pytest.mark.parametrize("name, architecture", [("qwen3-30b-a3b", "Qwen3MoeForCausalLM"),
                                                ("olmoe-1b-7b", "OlmoeForCausalLM")])
def test_the_written_config_json_is_transformers_model_of_the_cards_count(
        name: str, architecture: str) -> None:
    """The card as config.json (the maps run backwards): transformers builds from it a model
    of the card's parameter count; moe-tiny (llama-tiny's sizes, no qk-norm, d_ff apart from
    moe_d_ff) is no layout's."""
    from zoo.files.hf_config import hf_config

    card = CATALOG.get(name)
    config = hf_config(card).config
    assert config is not None and config["architectures"] == [architecture]
    settings = {key: value for key, value in config.items()
                if key not in ("model_type", "architectures")}
    theirs, _ = meta_count(architecture.removesuffix("ForCausalLM"), settings)
    assert theirs == total_parameters(card.fields)
    assert hf_config(CATALOG.get("moe-tiny")).config is None
