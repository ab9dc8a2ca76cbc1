"""Gemma 3 and Gemma 2 text decoders (issue #34): tiny random Gemma3ForCausalLM and
Gemma2ForCausalLM models, saved with save_pretrained and imported with `zoo import`, compute
transformers' logits on a left-padded batch of prompts longer than the sliding window and
generate its greedy tokens across the window, in PyTorch and through the ONNX export (plain, and
--optimize's GroupQueryAttention with local_window_size, scale and softcap); the published
cards hold transformers' own parameter counts; what the zoo cannot compute is refused by name.

`transformers` is a test-only dependency: it makes the reference models here."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
import torch

from export.opening import open_model
from registry.params import count_parameters
from runtime.generate import generate, left_padded
from tests.conftest import SharedExport, card, on_shared
from tests.support.greedy import padded, transformers_greedy
from tests.support.helpers import imported_folders, zoo
from tests.support.hf_decoders import GEMMA_CASES as CASES
from tests.support.hf_decoders import GEMMA_SIZES as SIZES
from tests.support.hf_decoders import GEMMA_WINDOW as WINDOW
from tests.support.hf_decoders import (
    assert_import_refused,
    assert_padded_logits_match,
    changed_source,
    randomise,
)
from zoo.assemble import build_model
from zoo.files.weights import load_built

transformers = pytest.importorskip("transformers")

ATOL = 1e-4
STEPS = 60  # new tokens: from prompts past the window of 8, far across it
PROMPTS = [[11, 52, 7, 80, 33, 19, 64, 21, 45, 70, 14, 88, 30], [40, 9, 71, 23, 5, 66, 12, 57,
                                                                  90, 31]]



@pytest.fixture(scope="module")
def sources(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Path, Any]]:
    root = tmp_path_factory.mktemp("hf")
    made = {}
    for name, (kind, extra) in CASES.items():
        config_class = getattr(transformers, f"{kind}TextConfig" if kind == "Gemma3"
                               else f"{kind}Config")
        model = randomise(getattr(transformers, f"{kind}ForCausalLM")(
            config_class(**SIZES, **extra)), norm_mean=0.0)  # Gemma's norms: offsets from one
        model.generation_config.eos_token_id = None  # the zoo's loop is told eos itself
        model.save_pretrained(root / name)
        made[name] = (root / name, model)
    return made


@pytest.fixture(scope="module")
def imported(sources: dict, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("imported")
    return imported_folders(sources, root)


@pytest.mark.parametrize("name", sorted(CASES))
def test_the_import_reads_every_gemma_setting(name: str, imported: dict) -> None:
    _, built = load_built(imported[name])
    gemma3 = name == "gemma3"
    assert built["attention_pattern"] == ("LLG" if gemma3 else "LG")
    assert (built["sliding_window"], built["query_pre_attn_scalar"]) == (WINDOW, 24)
    assert (built["norm"], built["activation"]) == ("rmsnorm_gemma", "geglu_tanh")
    assert built["sandwich_norm"] and built["scale_embeddings"] and built["tie_embeddings"]
    assert built["qk_norm"] == gemma3
    assert (built["rope_theta"], built["rope_theta_local"]) == ((5000.0, 300.0) if gemma3
                                                                else (500.0, None))
    assert built["rope_scaling"] == ({"rope_type": "linear", "factor": 4.0} if gemma3 else None)
    assert (built["attn_logit_softcapping"], built["final_logit_softcapping"]) == (
        (None, None) if gemma3 else (2.0, 3.0))


@pytest.mark.parametrize("name", sorted(CASES))
def test_logits_on_a_left_padded_batch_past_the_window_match_transformers(
        name: str, sources: dict, imported: dict) -> None:
    _, reference = sources[name]
    model, _ = load_built(imported[name])
    ids, mask = padded(PROMPTS, 0)
    assert ids.shape[1] > WINDOW + 4  # the local layers drop keys the global ones keep
    assert_padded_logits_match(model, reference, ids, mask, ATOL)


@pytest.mark.parametrize("name", sorted(CASES))
def test_greedy_tokens_across_the_window_match_transformers_generate(
        name: str, sources: dict, imported: dict) -> None:
    _, reference = sources[name]
    model, built = load_built(imported[name])
    ids, mask = left_padded(PROMPTS, built["pad_token_id"])
    tokens = generate(open_model(model, built), ids, mask, STEPS, eos=None)
    assert tokens.tolist() == transformers_greedy(reference, PROMPTS, STEPS, every_step=True)


@pytest.mark.parametrize("name, optimize", [
    ("gemma3", False), ("gemma3", True), ("gemma2", True),
    pytest.param("gemma2", False, marks=pytest.mark.slow),  # its caps are plain Tanh nodes
])
def test_an_imported_gemma_exports_and_generates_transformers_tokens(
        name: str, optimize: bool, sources: dict, imported: dict, tmp_path: Path) -> None:
    """The export's own parity grid (cases past the window) and its shared-cache check pass,
    and the ONNX loop gives transformers' tokens; --optimize's graph runs GroupQueryAttention
    with the window, the query scale and (Gemma 2) the score cap."""
    import onnx

    from zoo import ExportOptions, GenerateOptions, export_model, load

    out = tmp_path / "onnx"
    export_model(imported[name], out, ExportOptions(optimize=optimize))
    if optimize:
        graph = onnx.load(out / "onnx" / "model_kv.onnx", load_external_data=False)
        attributes = [{a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
                      for node in graph.graph.node if node.op_type == "GroupQueryAttention"]
        windows = [a.get("local_window_size", -1) for a in attributes]
        assert windows == ([WINDOW, WINDOW, -1] if name == "gemma3" else [WINDOW, -1, WINDOW])
        assert all(a["scale"] == pytest.approx(24**-0.5) for a in attributes)
        assert all(a.get("softcap") == (None if name == "gemma3" else 2.0) for a in attributes)
    if name == "gemma3":
        check_config_json(out)
    exported = load(out)
    generated = exported.generate(PROMPTS, GenerateOptions(max_new_tokens=STEPS))
    expected = transformers_greedy(sources[name][1], PROMPTS, STEPS, every_step=True)
    eos = exported.card["eos_token_id"]
    for row, want in zip(generated, expected, strict=True):  # the zoo stops at eos, pads with it
        end = want.index(eos) + 1 if eos in want else STEPS
        assert row.ids[:end] == want[:end]


def check_config_json(out: Path) -> None:
    """The export's config.json (the clients' layout) is one transformers loads as the
    Gemma3ForCausalLM it came from; GenAI's config names its text-only Gemma 3."""
    config = transformers.AutoConfig.from_pretrained(out)
    assert config.architectures == ["Gemma3ForCausalLM"]
    assert config.layer_types == ["sliding_attention", "sliding_attention", "full_attention"]
    assert (config.sliding_window, config.query_pre_attn_scalar) == (WINDOW, 24)
    assert config.rope_parameters["sliding_attention"]["rope_theta"] == 300.0
    assert config.rope_parameters["full_attention"]["factor"] == 4.0
    genai = json.loads((out / "genai_config.json").read_text())["model"]
    assert genai["type"] == "gemma3_text"  # GenAI's text-only Gemma 3


@on_shared("gemma-tiny")
@pytest.mark.parametrize("variant", ["plain", "optimize"])
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


# --- refusals: exit 2, one line naming config.json and the key, nothing written ------------

REFUSED = {  # case: (source, config.json changes, parts of the one error line)
    "bidirectional": ("gemma3", {"use_bidirectional_attention": True},
                      ["use_bidirectional_attention=True"]),
    "layer-kind": ("gemma3", {"layer_types": ["chunked_attention"] * 3},
                   ["layer_types=['chunked_attention'", "sliding_attention, full_attention"]),
    "local-rope-scaled": ("gemma3", {"rope_parameters": {
        "full_attention": {"rope_type": "default", "rope_theta": 5000.0},
        "sliding_attention": {"rope_type": "linear", "factor": 2.0, "rope_theta": 300.0}}},
        ["rope_parameters.sliding_attention has rope_type='linear'"]),
    "activation": ("gemma2", {"hidden_activation": "relu"},
                   ["hidden_activation='relu' is not supported"]),
}


@pytest.mark.parametrize("case", sorted(REFUSED))
def test_refusals(case: str, sources: dict, tmp_path: Path,
                  monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    name, changes, parts = REFUSED[case]
    changed_source(sources[name][0], changes, tmp_path)
    assert_import_refused(tmp_path, "error: src/config.json: ", *parts)


def test_an_explicit_null_cap_is_no_cap(sources: dict, tmp_path: Path) -> None:
    """Gemma 2's config.json says null for a cap it turned off; an absent key is
    transformers' default (50 and 30)."""
    folder = shutil.copytree(sources["gemma2"][0], tmp_path / "src")
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
