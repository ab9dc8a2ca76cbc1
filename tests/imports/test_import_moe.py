"""`zoo import` of mixture-of-experts folders (Qwen3MoeForCausalLM, OlmoeForCausalLM,
MixtralForCausalLM): tiny random transformers models, saved with save_pretrained and imported
through their layout maps, compute transformers' logits on a left-padded batch and generate its
greedy tokens, in PyTorch and through ONNX exports (plain and --optimize); what the zoo cannot
compute is refused in one line.

`transformers` is a test-only dependency: it makes the reference models here."""

from __future__ import annotations

import json
from pathlib import Path

import onnx
import pytest
import torch
from safetensors.torch import load_file, save_file

from export.opening import open_model
from runtime.generate import generate, left_padded
from tests.support.greedy import padded, transformers_greedy
from tests.support.helpers import imported_folders
from tests.support.hf_decoders import MOE_CASES as CASES
from tests.support.hf_decoders import MOE_SIZES as SIZES
from tests.support.hf_decoders import (
    assert_import_refused,
    assert_padded_logits_match,
    changed_source,
    randomise,
)
from zoo.blocks.experts import MixtureOfExperts
from zoo.blocks.feedforward import SwiGLUFeedForward
from zoo.files.importers import RECORD
from zoo.files.weights import load_built

transformers = pytest.importorskip("transformers")

ATOL = 1e-4
STEPS = 8
SPARSE = {"qwen3_moe": [False, True, True], "qwen3_moe-step": [False, True, False],
          "olmoe": [True] * 3, "mixtral": [True] * 3}
PROMPTS = [[11, 52, 7, 80, 33, 19, 64], [40, 9, 71, 23]]  # the second left-padded


@pytest.fixture(scope="module")
def sources(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Path, torch.nn.Module]]:
    root = tmp_path_factory.mktemp("hf-moe")
    made = {}
    for name, (kind, extra) in CASES.items():
        config = getattr(transformers, f"{kind}Config")(**{**SIZES, **extra})
        model = randomise(getattr(transformers, f"{kind}ForCausalLM")(config))
        model.save_pretrained(root / name)
        made[name] = (root / name, model)
    return made


@pytest.fixture(scope="module")
def imported(sources: dict, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("imported-moe")
    return imported_folders(sources, root)


@pytest.mark.parametrize("name", sorted(CASES))
def test_the_card_has_transformers_experts_and_layers(name: str, sources: dict,
                                                      imported: dict) -> None:
    _, reference = sources[name]
    model, card = load_built(imported[name])
    config = reference.config
    assert card["activation"] == "moe"
    assert (card["n_experts"], card["n_experts_per_token"]) == (4, 2)
    assert card["norm_topk_prob"] == (name in ("qwen3_moe", "mixtral"))
    assert card["qk_norm_scope"] == ("projection" if name == "olmoe" else "head")
    ours = [isinstance(layer.feed_forward, MixtureOfExperts) for layer in model.layers]
    theirs = [hasattr(layer.mlp, "experts") for layer in reference.model.layers] \
        if name != "mixtral" else [True] * config.num_hidden_layers
    assert ours == theirs == SPARSE[name]
    assert all(isinstance(layer.feed_forward, SwiGLUFeedForward)
               for layer, sparse in zip(model.layers, ours, strict=True) if not sparse)
    assert sum(p.numel() for p in model.parameters()) == reference.num_parameters()
    record = json.loads((imported[name] / RECORD).read_text(encoding="utf-8"))
    assert record["map"] == f"registry/maps/{name.split('-')[0]}.yaml"


@pytest.mark.parametrize("name", sorted(CASES))
def test_logits_on_a_left_padded_batch_match_transformers(name: str, sources: dict,
                                                          imported: dict) -> None:
    _, reference = sources[name]
    model, _ = load_built(imported[name])
    ids, mask = padded(PROMPTS, 0)
    assert_padded_logits_match(model, reference, ids, mask, ATOL)


@pytest.mark.parametrize("name", sorted(CASES))
def test_greedy_tokens_match_transformers_generate(name: str, sources: dict,
                                                   imported: dict) -> None:
    _, reference = sources[name]
    model, card = load_built(imported[name])
    ids, mask = left_padded(PROMPTS, card["pad_token_id"])
    tokens = generate(open_model(model, card), ids, mask, STEPS, eos=card["eos_token_id"])
    assert tokens.tolist() == transformers_greedy(reference, PROMPTS, STEPS, card["eos_token_id"])


@pytest.mark.parametrize("name, optimize", [
    pytest.param("qwen3_moe", False, marks=pytest.mark.slow), ("olmoe", True),
    pytest.param("mixtral", True, marks=pytest.mark.slow)])
def test_an_imported_mixture_exports_and_generates_transformers_tokens(
        name: str, optimize: bool, sources: dict, imported: dict, tmp_path: Path) -> None:
    """Exported (the parity grid against PyTorch runs inside), then generating through ONNX
    Runtime: plain, and --optimize's shared-cache graph (an export: tens of seconds each)."""
    from zoo import ExportOptions, GenerateOptions, export_model, load

    export_model(imported[name], tmp_path / "onnx", ExportOptions(optimize=optimize))
    _, card = load_built(imported[name])
    eos = card["eos_token_id"]
    generated = load(tmp_path / "onnx").generate(PROMPTS, GenerateOptions(max_new_tokens=STEPS))
    rows = [row.ids + [eos] * (STEPS - len(row.ids)) for row in generated]  # ended at eos
    assert rows == transformers_greedy(sources[name][1], PROMPTS, STEPS, eos)
    if optimize:  # ONNX Runtime's MoE, OLMoE's unrenormalised top k rescaled after it
        kv = onnx.load(str(tmp_path / "onnx" / "onnx" / "model_kv.onnx"),
                       load_external_data=False)
        assert "MoE" in {n.op_type for n in kv.graph.node}


# --- refusals: exit 2, one line naming the file and the key, nothing written ---------------

def _fused(folder: Path) -> None:
    """The experts as transformers 5 holds them in memory (one 3-D gate_up_proj, down_proj)."""
    path = folder / "model.safetensors"
    tensors = load_file(path)
    for layer in (1, 2):
        prefix = f"model.layers.{layer}.mlp.experts"
        names = [f"{prefix}.{e}.{part}_proj.weight" for e in range(4)
                 for part in ("gate", "up", "down")]
        gate_up = torch.stack([torch.cat([tensors[f"{prefix}.{e}.gate_proj.weight"],
                                          tensors[f"{prefix}.{e}.up_proj.weight"]])
                               for e in range(4)])
        down = torch.stack([tensors[f"{prefix}.{e}.down_proj.weight"] for e in range(4)])
        for key in names:
            del tensors[key]
        tensors[f"{prefix}.gate_up_proj"], tensors[f"{prefix}.down_proj"] = gate_up, down
    save_file(tensors, path)


REFUSED = {  # case: (source, config.json changes, a change to the folder, the error's parts)
    "olmoe-clip-qkv": ("olmoe", {"clip_qkv": 8.0}, None,
                       ["src/config.json", "clip_qkv=8.0 (needs None)"]),
    "qwen3-moe-gelu": ("qwen3_moe", {"hidden_act": "gelu"}, None,
                       ["src/config.json", "hidden_act='gelu' is not supported"]),
    "top-k-above-experts": ("mixtral", {"num_experts_per_tok": 5}, None,
                            ["n_experts_per_token=5 should be <= n_experts=4"]),
    "qwen2-moe-shared-expert": ("qwen3_moe", {"model_type": "qwen2_moe",
                                              "architectures": ["Qwen2MoeForCausalLM"]}, None,
                                ["'qwen2_moe'", "not a known layout"]),
    "fused-experts": ("qwen3_moe", {}, _fused,
                      ["src/model.safetensors", "missing: layers.1.mlp.experts.0.down_proj.weight",
                       "unexpected: model.layers.1.mlp.experts.down_proj"]),
}


@pytest.mark.parametrize("case", sorted(REFUSED))
def test_refusals(case: str, sources: dict, tmp_path: Path,
                  monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    name, changes, change_folder, parts = REFUSED[case]
    folder = changed_source(sources[name][0], changes, tmp_path)
    if change_folder is not None:
        change_folder(folder)
    assert_import_refused(tmp_path, *parts)
