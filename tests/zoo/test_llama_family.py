"""Llama-family decoders built from the shared blocks (issue #24's foundation): grouped-query
attention (`n_kv_heads`), an explicit `head_dim`, q/k/v biases apart from the output
projection's (`attention_bias`, Qwen2) and a norm over each head's queries and keys (`qk_norm`,
Qwen3), against transformers' own LlamaForCausalLM, Qwen2ForCausalLM and Qwen3ForCausalLM on
the same weights: a left-padded batch, and a decoding step on the cache."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from registry.params import count_parameters
from tests.conftest import SharedExport, card, on_shared, random_ids, renamed
from tests.support.hf_decoders import randomise
from zoo.assemble import build_model

transformers = pytest.importorskip("transformers")

YARN = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 16,
        "beta_fast": 16.0, "beta_slow": 2.0}
VARIANTS = {  # zoo card fields, and what transformers' class is told besides the sizes
    "llama-gqa": ({"n_kv_heads": 2}, "Llama", {"attention_bias": False, "mlp_bias": False}),
    "qwen2-qkv-bias": ({"n_kv_heads": 2, "attention_bias": True}, "Qwen2", {}),
    "qwen3-qk-norm": ({"n_kv_heads": 1, "head_dim": 24, "qk_norm": True}, "Qwen3",
                      {"attention_bias": False}),
    "llama-rope-llama3": ({"n_kv_heads": 2, "rope_scaling": {
        "rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
        "original_max_position_embeddings": 16}}, "Llama", {}),
    "llama-rope-linear": ({"rope_scaling": {"rope_type": "linear", "factor": 4.0}}, "Llama", {}),
    "llama-rope-yarn": ({"n_kv_heads": 2, "rope_scaling": YARN}, "Llama", {}),
}
PUBLISHED = {"smollm2-135m": 134_515_008, "qwen2.5-0.5b": 494_032_768,
             "qwen3-0.6b": 596_049_920, "llama-3.2-1b": 1_235_814_400}
NAMES = {"embeddings.token": "model.embed_tokens", "final_norm": "model.norm",
         "self_attention.query_norm": "self_attn.q_norm",
         "self_attention.key_norm": "self_attn.k_norm",
         "self_attention.query": "self_attn.q_proj", "self_attention.key": "self_attn.k_proj",
         "self_attention.value": "self_attn.v_proj", "self_attention.out": "self_attn.o_proj",
         "feed_forward.gate": "mlp.gate_proj", "feed_forward.up": "mlp.up_proj",
         "feed_forward.down": "mlp.down_proj", "norms.0": "input_layernorm",
         "norms.1": "post_attention_layernorm", "layers.": "model.layers.", "head.weight":
         "lm_head.weight"}


def pair(variant: str, **more: object) -> tuple[torch.nn.Module, torch.nn.Module, object]:
    """(ours, transformers', card) with the same random weights (biases and norms randomised
    too, so each one counts); `more`: card fields besides the variant's."""
    fields, kind, extra = VARIANTS[variant]
    tiny = card("llama-tiny", dropout=0.0, rope_theta=500.0, **fields, **more)
    ours = build_model(tiny, seed=3).eval()
    with torch.no_grad():
        for name, parameter in ours.named_parameters():
            if name.endswith("bias") or "norm" in name:
                parameter.normal_(0.5 if "norm" in name else 0.0, 0.2)
    config = getattr(transformers, f"{kind}Config")(
        vocab_size=tiny["vocab_size"], hidden_size=tiny["d_model"],
        intermediate_size=tiny["d_ff"], num_hidden_layers=tiny["n_layers"],
        num_attention_heads=tiny["n_heads"], num_key_value_heads=tiny["n_kv_heads"],
        head_dim=tiny["head_dim"] or tiny["d_model"] // tiny["n_heads"],
        max_position_embeddings=tiny["max_positions"], rms_norm_eps=tiny["norm_eps"],
        rope_theta=tiny["rope_theta"], rope_scaling=tiny["rope_scaling"],
        tie_word_embeddings=False, **extra)
    reference = getattr(transformers, f"{kind}ForCausalLM")(config).eval()
    missing, unexpected = reference.load_state_dict(renamed(ours.state_dict(), NAMES),
                                                    strict=False)
    assert not unexpected and not missing, (missing, unexpected)
    return ours, reference, tiny


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_a_left_padded_batch_gives_transformers_logits(variant: str) -> None:
    ours, reference, tiny = pair(variant)
    ids = random_ids(tiny, 2, 9)
    mask = torch.ones_like(ids)
    mask[1, :3] = 0  # the second row left-padded
    with torch.no_grad():
        expected = reference(ids, attention_mask=mask).logits
        logits, _ = ours(ids, mask)
    real = mask.bool()
    torch.testing.assert_close(logits[real], expected[real], atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_a_step_on_the_cache_gives_transformers_logits(variant: str) -> None:
    """The cache holds the key/value heads only (n_kv_heads of them), and a step on it gives
    what the whole sequence gives."""
    ours, reference, tiny = pair(variant)
    ids = random_ids(tiny, 2, 8)
    with torch.no_grad():
        expected = reference(ids).logits[:, -1]
        _, past = ours(ids[:, :-1])
        step, _ = ours(ids[:, -1:], torch.ones_like(ids), None, past)
    heads = tiny["n_kv_heads"]
    head_dim = tiny["head_dim"] or tiny["d_model"] // tiny["n_heads"]
    assert all(key.shape == (2, heads, 7, head_dim) for key, _ in past)
    torch.testing.assert_close(step[:, -1], expected, atol=1e-5, rtol=1e-4)


ROPES = ["llama-gqa", "llama-rope-llama3", "llama-rope-linear", "llama-rope-yarn"]


@pytest.mark.parametrize("variant", ROPES)
def test_logits_past_position_1000_are_transformers(variant: str) -> None:
    """Issue 49, finding 3: each rope type the cards use, over 1,100 positions (rope_theta 500,
    so the angles turn fast). The frequencies are transformers' float32 bits
    (tests/zoo/test_references.py), so the angles are too: the logits agree at every position as
    they do at the first ones. With frequencies computed in float64 and rounded, the largest
    difference grew down the positions to several times this tolerance."""
    ours, reference, tiny = pair(variant, max_positions=1152)
    reference.load_state_dict(renamed(randomise(ours).state_dict(), NAMES), strict=False)
    ids = random_ids(tiny, 1, 1100)
    with torch.no_grad():
        expected = reference(ids).logits[0]
        logits, _ = ours(ids)
    scale = float(expected.abs().max())
    assert scale > 1.0
    # twice the float32 summation noise measured over 1,100 keys (2.8e-6 of the scale), a third
    # of the smallest difference float64 frequencies made past position 1000 (1.7e-5)
    torch.testing.assert_close(logits[0, 1000:], expected[1000:], atol=6e-6 * scale, rtol=0)


@pytest.mark.parametrize("head_dim", [16, 64, 128, 256])
@pytest.mark.parametrize("theta", [500.0, 10000.0, 500000.0, 1000000.0])
@pytest.mark.parametrize("scaling", [
    None, {"rope_type": "linear", "factor": 4.0},
    {"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
     "original_max_position_embeddings": 8192},
    {**YARN, "original_max_position_embeddings": 4096},
    {"rope_type": "yarn", "factor": 8.0, "original_max_position_embeddings": 4096,
     "mscale": 0.707, "mscale_all_dim": 0.707, "truncate": False}],
    ids=["default", "linear", "llama3", "yarn", "yarn-mscale-untruncated"])
def test_rotary_frequencies_are_transformers_bits(scaling: dict | None, theta: float,
                                                  head_dim: int) -> None:
    """The frequencies and the cos/sin scale, equal to the last bit to what transformers'
    rotary embedding computes for the same config."""
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

    from zoo.blocks.positions import RotaryPositions

    config = transformers.LlamaConfig(hidden_size=head_dim * 2, num_attention_heads=2,
                                      head_dim=head_dim, max_position_embeddings=32768,
                                      rope_theta=theta,  # a copy: transformers adds to it
                                      rope_scaling=dict(scaling) if scaling else None)
    theirs = LlamaRotaryEmbedding(config)
    ours = RotaryPositions(head_dim * 2, 32768, head_dim, theta, scaling)
    assert ours.inv_freq.dtype == theirs.inv_freq.dtype == torch.float32
    assert torch.equal(ours.inv_freq, theirs.inv_freq)
    assert ours.attention_scale == theirs.attention_scaling


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_parameter_arithmetic_counts_what_transformers_holds(variant: str) -> None:
    ours, reference, tiny = pair(variant)
    expected = sum(p.numel() for p in reference.parameters())
    assert sum(count_parameters(tiny.fields).values()) == expected
    assert sum(p.numel() for p in ours.parameters()) == expected


def test_n_kv_heads_must_divide_n_heads() -> None:
    from registry.errors import CardError

    with pytest.raises(CardError, match="n_kv_heads=3 does not divide n_heads=4"):
        card("llama-tiny", n_kv_heads=3)


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_published_cards_hold_the_published_parameter_counts(name: str) -> None:
    """`zoo show`'s arithmetic (no torch) and the modules built on the meta device."""
    published = card(name)
    assert sum(count_parameters(published.fields).values()) == PUBLISHED[name]
    model = build_model(published, meta=True)
    assert sum(p.numel() for p in model.parameters()) == PUBLISHED[name]


@pytest.mark.parametrize("scaling, message", [
    ({"rope_type": "longrope", "factor": 4.0}, "rope_type='longrope' is not supported"),
    ({"rope_type": "yarn", "factor": 4.0}, "original_max_position_embeddings=None"),
    ({"rope_type": "llama3", "factor": 8.0}, "low_freq_factor=None should be a number > 0"),
    ({"rope_type": "linear", "factor": -1}, "factor=-1 should be a number > 0"),
])
def test_rope_scalings_the_block_does_not_compute_are_refused(scaling: dict, message: str
                                                              ) -> None:
    from registry.errors import CardError

    with pytest.raises(CardError, match=message):
        card("llama-tiny", rope_scaling=scaling)


@on_shared("llama-tiny")
@pytest.mark.parametrize("variant", ["plain", "optimize"])
def test_genai_runs_a_grouped_query_export_under_its_llama_type(variant: str,
                                                                shared_export: SharedExport
                                                                ) -> None:
    """GenAI's native llama type reads the export's 2 key/value heads and gives the zoo's
    greedy tokens (the plain graph, and --optimize's shared-buffer GroupQueryAttention one)."""
    pytest.importorskip("onnxruntime_genai")
    from tests.support.genai import genai_greedy
    from zoo import GenerateOptions, load

    folder = shared_export("llama-tiny", variant)[0]
    config = json.loads((folder / "genai_config.json").read_text())["model"]
    assert config["type"] == "llama" and config["decoder"]["num_key_value_heads"] == 2
    prompts = [[40, 41, 42, 43], [7, 8]]
    zoo = [row.ids for row in load(folder).generate(prompts, GenerateOptions(max_new_tokens=6))]
    assert genai_greedy(folder, prompts, 6) == zoo


def test_genai_types_follow_the_layout() -> None:
    from export.targets.genai import model_type

    assert [model_type(card(name)) for name in ("gpt-tiny", "llama-tiny", "smollm2-135m",
                                                "qwen2.5-0.5b", "qwen3-0.6b")] == [
        "decoder", "llama", "llama", "qwen2", "qwen3"]


def test_the_parity_grid_of_a_long_context_card_stays_within_memory_and_time() -> None:
    """SmolLM2's 8,192 positions in one (3, 9, T, T) eager score tensor would be 7 GB a layer;
    the grid's longest case stops at GPT-2's 1,024, and shorter as parameters x tokens grows
    (the eager reference's cost): counted from the published sizes, not from the code."""
    from export.checks.cases import LONGEST, SHORTEST, TOKEN_BUDGET, longest

    assert LONGEST == 1024 and SHORTEST == 128
    assert longest(card("llama-tiny")) == 128  # a tiny card keeps its maximum
    assert longest(card("transformer-base")) == 512  # 63M parameters: its whole context
    for name, parameters in (("smollm2-135m", 134_515_008), ("gpt2-small", 124_439_808)):
        assert 256 * parameters <= TOKEN_BUDGET < 512 * parameters
        assert longest(card(name)) == 256
    assert longest(card("llama-3.2-1b")) == SHORTEST  # 1.24B: the floor


@on_shared("llama-tiny")
def test_the_shared_cache_graph_rotates_in_the_kernel_and_norms_fuse(
        shared_export: SharedExport, tmp_path: Path) -> None:
    """--optimize's model_kv.onnx hands rotary to GroupQueryAttention (do_rotary, with cos and
    sin tables of the card's max_positions rows and head_dim / 2 columns: no half-rotation
    left in the graph), and every RMSNorm becomes one SimplifiedLayerNormalization (or its Skip
    form) when ONNX Runtime loads the graph. Its tokens are the PyTorch model's: the export's
    own check, and here PyTorch's greedy tokens through the shared-cache loop."""
    import numpy as np
    import onnx
    import onnxruntime as ort

    from export.onnx.shared_cache import KV_FILE
    from export.opening import open_export, open_model
    from registry.sizes import attention_sizes
    from runtime.generate import generate
    from zoo.files.weights import load_built

    folder, report = shared_export("llama-tiny", "optimize")
    # GroupQueryAttention comes from the exporter: no missing attention fusion is noted for it
    assert not [note for note in report.notes if note.startswith(f"note: {KV_FILE}:")]
    graph = onnx.load(str(folder / KV_FILE), load_external_data=False)
    attentions = [n for n in graph.graph.node if n.op_type == "GroupQueryAttention"]
    tiny = card("llama-tiny")
    assert len(attentions) == tiny["n_layers"]
    head_dim = attention_sizes(tiny).head_dim
    shapes = {i.name: list(i.dims) for i in graph.graph.initializer}
    for node in attentions:
        assert {a.name: a.i for a in node.attribute}["do_rotary"] == 1
        assert shapes.get(node.input[7]) == [tiny["max_positions"], head_dim // 2]
    assert not any(n.op_type == "Neg" for n in graph.graph.node)
    options = ort.SessionOptions()
    options.optimized_model_filepath = str(tmp_path / "loaded.onnx")
    ort.InferenceSession(str(folder / KV_FILE), options,
                         providers=["CPUExecutionProvider"])
    loaded = [n.op_type for n in onnx.load(str(tmp_path / "loaded.onnx"),
                                           load_external_data=False).graph.node]
    norms = sum(op.endswith("SimplifiedLayerNormalization") for op in loaded)
    assert norms == 2 * tiny["n_layers"] + 1 and "Sqrt" not in loaded
    ids = np.array([[40, 41, 42, 43, 44], [0, 0, 7, 8, 9]])
    mask = (np.arange(5) >= np.array([[0], [2]])).astype(np.int64)
    torch_tokens = generate(open_model(*load_built(folder)), ids, mask, 8)
    assert np.array_equal(generate(open_export(folder), ids, mask, 8), torch_tokens)


@pytest.mark.xdist_group("tests/zoo/test_llama_family.py")  # its own export: any worker
def test_a_yarn_scaled_card_exports_with_the_kernels_rotary(tmp_path: Path) -> None:
    """YaRN scales cos and sin as well as the frequencies: GroupQueryAttention's tables must
    carry that scale. The shared-cache graph's logits after a prompt and after each step are
    PyTorch's (whose rotary transformers' YaRN matches above), past
    original_max_position_embeddings, where YaRN's ramp matters."""
    import numpy as np

    from export.opening import open_export
    from export.options import ExportOptions
    from export.pipeline import export_and_verify
    from runtime.generate import open_session

    yarn = card("llama-tiny", rope_scaling=YARN)
    model = build_model(yarn, seed=3).eval()
    assert export_and_verify(model, yarn, tmp_path / "out", ExportOptions(optimize=True)).passed
    ids = np.arange(40, 58)[None]  # 18 tokens, then 6 steps: positions up to 23
    session = open_session(open_export(tmp_path / "out"), capacity=32)
    logits = [session.prefill(ids, None)]
    for token in (7, 8, 9, 10, 11, 12):
        logits.append(session.step(np.array([[token]])))
        ids = np.concatenate([ids, [[token]]], axis=1)
    with torch.no_grad():
        expected = model(torch.from_numpy(ids))[0][0, 17:].numpy()
    np.testing.assert_allclose(np.concatenate(logits), expected, atol=1e-4, rtol=0)


@pytest.mark.xdist_group("tests/zoo/test_llama_family.py")  # its own export: any worker
def test_the_exports_loop_check_compares_logits_not_only_tokens(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Rotary tables that miss YaRN's scale (a bug that once shipped: greedy tokens stayed the
    plain loop's) are refused by `zoo export`'s own check, on the shared-cache loop's logits."""
    from export.checks.parity import ParityError
    from export.onnx import shared_cache
    from export.options import ExportOptions
    from export.pipeline import export_and_verify

    scaled = shared_cache.rotary_tables

    def unscaled(model: torch.nn.Module, card_: object) -> object:
        cos, sin = scaled(model, card_)
        scale = model.embeddings.position.attention_scale
        return cos / scale, sin / scale

    yarn = card("llama-tiny", rope_scaling=YARN)
    model = build_model(yarn, seed=3).eval()
    assert model.embeddings.position.attention_scale > 1.1  # YaRN's 0.1 ln(4) + 1
    monkeypatch.setattr(shared_cache, "rotary_tables", unscaled)
    with pytest.raises(ParityError, match="model_kv:logits"):
        export_and_verify(model, yarn, tmp_path / "out", ExportOptions(optimize=True))
    assert not (tmp_path / "out").exists()
