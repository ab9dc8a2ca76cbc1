"""Gemma 3 and Gemma 2 (issue #34) beyond tests/imports/test_hf_decoders.py's rows (which import
tiny random Gemma3ForCausalLM and Gemma2ForCausalLM models and check their settings, logits past
the sliding window, greedy tokens and exports against transformers): gemma-tiny under ONNX
Runtime GenAI, the published cards' parameter counts, Gemma 2's null caps, the parity grid's
reach past a published window, and the card fields the blocks cannot compute.

Not rows of tests/support/hf_decoders.py's DECODERS: each is about the zoo's Gemma cards or one
config.json value of Gemma 2's, not a transformers architecture's import.

`transformers` is a test-only dependency: it makes the reference models here."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from registry.params import count_parameters
from tests.conftest import SharedExport, card, on_shared
from tests.support.helpers import zoo
from tests.support.hf_decoders import DECODERS, saved
from zoo.assemble import build_model
from zoo.files.weights import load_built

transformers = pytest.importorskip("transformers")


@on_shared("gemma-tiny")
# --optimize's graph only in make test-slow: its own export (tens of seconds), and its local
# windows are checked against transformers in tests/imports/test_hf_decoders.py (gemma3)
@pytest.mark.parametrize("variant", ["plain", pytest.param("optimize", marks=pytest.mark.slow)])
def test_genai_generates_the_zoos_tokens_past_the_window(variant: str,
                                                         shared_export: SharedExport) -> None:
    """ONNX Runtime GenAI's own loop under its gemma3_text type, on a prompt past gemma-tiny's
    window of 16 and 40 tokens after it (the plain graph, and --optimize's GroupQueryAttention
    with local_window_size, which GenAI drives with its shared buffers)."""
    pytest.importorskip("onnxruntime_genai")
    from tests.support.genai import genai_greedy
    from zoo import GenerateOptions, load

    folder = shared_export("gemma-tiny", variant)[0]
    assert json.loads((folder / "genai_config.json").read_text())["model"]["type"] == \
        "gemma3_text"
    prompts = [list(range(10, 40)), list(range(50, 62))]
    zoo_tokens = [row.ids for row in load(folder).generate(prompts,
                                                           GenerateOptions(max_new_tokens=40))]
    assert genai_greedy(folder, prompts, 40) == zoo_tokens


# --- the published cards -------------------------------------------------------------------

PUBLISHED = {  # config.json values of google/gemma-3-270m and google/gemma-3-1b-pt
    "gemma-3-270m": dict(hidden_size=640, intermediate_size=2048, num_hidden_layers=18),
    "gemma-3-1b": dict(hidden_size=1152, intermediate_size=6912, num_hidden_layers=26),
}


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_published_cards_hold_transformers_parameter_counts(name: str) -> None:
    config = transformers.Gemma3TextConfig(
        vocab_size=262144, num_attention_heads=4, num_key_value_heads=1, head_dim=256,
        max_position_embeddings=32768, query_pre_attn_scalar=256, sliding_window=512,
        rope_theta=1_000_000.0, rope_local_base_freq=10_000.0, **PUBLISHED[name])
    with torch.device("meta"):
        expected = sum(p.numel() for p in transformers.Gemma3ForCausalLM(config).parameters())
    published = card(name)
    assert sum(count_parameters(published.fields).values()) == expected
    assert sum(p.numel() for p in build_model(published, meta=True).parameters()) == expected
    layer_types = ["L" if kind == "sliding_attention" else "G" for kind in config.layer_types]
    pattern = published["attention_pattern"]
    assert [pattern[i % len(pattern)] for i in range(published["n_layers"])] == layer_types


def test_an_explicit_null_cap_is_no_cap(tmp_path: Path) -> None:
    """Gemma 2's config.json says null for a cap it turned off; an absent key is
    transformers' default (50 and 30)."""
    folder, _ = saved(DECODERS["gemma2"], tmp_path / "src")
    path = folder / "config.json"
    config = json.loads(path.read_text())
    config["attn_logit_softcapping"] = None
    del config["final_logit_softcapping"]
    path.write_text(json.dumps(config))
    assert zoo("import", str(folder), "-o", str(tmp_path / "out")).exit_code == 0
    _, built = load_built(tmp_path / "out")
    assert (built["attn_logit_softcapping"], built["final_logit_softcapping"]) == (None, 30.0)


def test_the_parity_grid_reaches_past_a_published_window() -> None:
    """gemma-3-270m's longest grid case stops at 128 tokens (the token budget), short of its
    window of 512: the window's own cases go past it (a prompt, and steps on a full window),
    where no other card gets any."""
    from export.checks.cases import longest, window_shapes

    gemma = card("gemma-3-270m")
    assert longest(gemma) < gemma["sliding_window"] == 512
    reach = [length + past for _, length, past, _ in window_shapes(gemma)]
    assert reach and min(reach) > 512 and max(reach) <= gemma["max_positions"]
    assert window_shapes(card("llama-tiny")) == []


@pytest.mark.parametrize("name, fields, message", [
    ("gemma-tiny", {"norm_placement": "post"}, "sandwich_norm applies only to norm_placement pre"),
    ("transformer-tiny", {"sandwich_norm": True}, "sandwich_norm applies only"),
    ("bert-tiny", {"final_logit_softcapping": 30.0}, "final_logit_softcapping applies only"),
    ("gemma-tiny", {"query_pre_attn_scalar": 0}, "query_pre_attn_scalar=0 should be >= 1"),
])
def test_cards_the_blocks_cannot_compute_are_refused(name: str, fields: dict,
                                                     message: str) -> None:
    from registry.errors import CardError

    with pytest.raises(CardError, match=message):
        card(name, **fields)
