"""`zoo import` of Hugging Face decoder folders, one check per test function, each run over the
rows of tests/support/hf_decoders.py's DECODERS that declare it: a tiny random transformers model
(Llama, Mistral, Qwen2, Qwen3, Gemma 3, Gemma 2, Qwen3-MoE, OLMoE, Mixtral, and settings worth a
model of their own), saved with save_pretrained and imported with the command line, holds
transformers' settings and parameters, computes its logits on a left-padded batch and generates
its greedy tokens, in PyTorch and through ONNX exports; what the zoo cannot compute is refused in
one line. Every expected value comes from transformers (its config, its model, its `generate`)
or from the row.

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
from tests.support.helpers import zoo_ok
from tests.support.hf_decoders import (
    CARD,
    EXPORT,
    GREEDY,
    LAYERS,
    LOGITS,
    RECORD,
    REFUSED,
    Decoder,
    assert_import_refused,
    assert_padded_logits_match,
    changed_source,
    rows,
    saved,
)
from tests.support.hf_decoders import DECODERS as TABLE
from zoo.files.importers import RECORD as RECORD_FILE
from zoo.files.weights import load_built

transformers = pytest.importorskip("transformers")

ATOL = 1e-4


class Folders:
    """Each row's saved transformers folder and its `zoo import`, made on first use (a worker
    makes only the rows its tests read)."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.sources: dict[str, tuple[Path, torch.nn.Module]] = {}

    def source(self, row: Decoder) -> tuple[Path, torch.nn.Module]:
        if row.id not in self.sources:
            self.sources[row.id] = saved(row, self.root / "hf" / row.id)
        return self.sources[row.id]

    def reference(self, row: Decoder) -> torch.nn.Module:
        return self.source(row)[1]

    def imported(self, row: Decoder) -> Path:
        out = self.root / "imported" / row.id
        if not out.exists():
            zoo_ok("import", self.source(row)[0], "-o", out)
        return out


@pytest.fixture(scope="module")
def folders(tmp_path_factory: pytest.TempPathFactory) -> Folders:
    return Folders(tmp_path_factory.mktemp("hf-decoders"))


# --- what the import reads ----------------------------------------------------------------

@pytest.mark.parametrize("row", rows(CARD))
def test_the_card_has_transformers_settings(row: Decoder, folders: Folders) -> None:
    """Sizes and settings as transformers' config holds them (its defaults filled in), and the
    row's own fields: what a config.json says only through its class or a nested key."""
    config = folders.reference(row).config
    _, card = load_built(folders.imported(row))
    theirs = dict(vocab_size=config.vocab_size, d_model=config.hidden_size,
                  n_layers=config.num_hidden_layers, n_heads=config.num_attention_heads,
                  n_kv_heads=config.num_key_value_heads, head_dim=getattr(config, "head_dim", None),
                  norm_eps=config.rms_norm_eps, tie_embeddings=config.tie_word_embeddings,
                  eos_token_id=config.eos_token_id, **row.card)
    assert {key: card[key] for key in theirs} == theirs


@pytest.mark.parametrize("row", rows(LAYERS))
def test_the_model_holds_transformers_parameters_and_experts(row: Decoder,
                                                             folders: Folders) -> None:
    """As many parameters as transformers' model; experts in the layers where it has them
    (the row's), the others SwiGLU."""
    from zoo.blocks.experts import MixtureOfExperts
    from zoo.blocks.feedforward import SwiGLUFeedForward

    reference = folders.reference(row)
    model, _ = load_built(folders.imported(row))
    assert sum(p.numel() for p in model.parameters()) == reference.num_parameters()
    theirs = [i for i, layer in enumerate(reference.model.layers) if hasattr(layer.mlp, "experts")]
    ours = [i for i, layer in enumerate(model.layers)
            if isinstance(layer.feed_forward, MixtureOfExperts)]
    assert ours == theirs == list(row.experts)
    if row.experts:
        assert all(isinstance(layer.feed_forward, SwiGLUFeedForward)
                   for i, layer in enumerate(model.layers) if i not in row.experts)


@pytest.mark.parametrize("row", rows(RECORD))
def test_the_record_names_the_map_and_the_head_is_tied_or_carried(row: Decoder,
                                                                  folders: Folders) -> None:
    """source.json names the layout map and the card it extends; the LM head is the token
    embedding or a tensor of its own, as transformers' config.json says."""
    tied = folders.reference(row).config.tie_word_embeddings
    folder = folders.imported(row)
    record = json.loads((folder / RECORD_FILE).read_text(encoding="utf-8"))
    layout = row.layout or folders.reference(row).config.model_type
    assert record["map"] == f"registry/maps/{layout}.yaml"
    assert record["extends"] == row.extends
    assert record["heads"] == {"tie_embeddings": tied}  # decoder maps name no other head
    model, _ = load_built(folder)
    assert ("head.weight" in model.state_dict()) != tied


# --- the same outputs as transformers ------------------------------------------------------

@pytest.mark.parametrize("row", rows(LOGITS))
def test_logits_on_a_left_padded_batch_match_transformers(row: Decoder, folders: Folders) -> None:
    model, _ = load_built(folders.imported(row))
    ids, mask = padded(row.prompts, 0)
    window = row.config.get("sliding_window")
    assert window is None or ids.shape[1] > window + 4  # local layers drop keys global ones keep
    assert_padded_logits_match(model, folders.reference(row), ids, mask, ATOL)


@pytest.mark.parametrize("row", rows(GREEDY))
def test_greedy_tokens_match_transformers_generate(row: Decoder, folders: Folders) -> None:
    model, card = load_built(folders.imported(row))
    ids, mask = left_padded(row.prompts, card["pad_token_id"])
    eos = None if row.every_step else card["eos_token_id"]
    tokens = generate(open_model(model, card), ids, mask, row.steps, eos=eos)
    assert tokens.tolist() == transformers_greedy(folders.reference(row), row.prompts, row.steps,
                                                  eos, every_step=row.every_step)


def exports() -> list[Any]:
    """(row, optimize) of each export the rows declare, each in an xdist group of its own (an
    export takes tens of seconds: they spread over the workers), slow where the row says."""
    return [pytest.param(row, optimize, id=name,
                         marks=[pytest.mark.xdist_group(f"hf-export-{name}"),
                                *([pytest.mark.slow] if slow else [])])
            for row in TABLE.values() if EXPORT in row.checks
            for optimize, slow in row.exports
            for name in [f"{row.id}-{'optimize' if optimize else 'plain'}"]]


@pytest.mark.parametrize("row, optimize", exports())
def test_an_import_exports_and_generates_transformers_tokens(row: Decoder, optimize: bool,
                                                             folders: Folders,
                                                             tmp_path: Path) -> None:
    """The export's own parity grid (cases past a sliding window) and shared-cache check pass,
    and the ONNX loop gives transformers' tokens. --optimize's graph runs GroupQueryAttention
    with transformers' window on its local layers, its query scale and its score cap, and
    ONNX Runtime's MoE where the model has experts; config.json reads back as the class it
    came from."""
    from zoo import ExportOptions, GenerateOptions, export_model, load

    reference = folders.reference(row)
    out = tmp_path / "onnx"
    export_model(folders.imported(row), out, ExportOptions(optimize=optimize))
    if optimize:
        check_optimized_graph(out, reference.config, bool(row.experts))
    check_config_json(out, row, reference.config)
    exported = load(out)
    generated = exported.generate(row.prompts, GenerateOptions(max_new_tokens=row.steps))
    eos = exported.card["eos_token_id"]
    expected = transformers_greedy(reference, row.prompts, row.steps,
                                   None if row.every_step else eos, every_step=row.every_step)
    for got, want in zip(generated, expected, strict=True):  # the zoo stops at eos
        end = want.index(eos) + 1 if eos in want else row.steps
        assert got.ids == want[:end]


def check_optimized_graph(out: Path, config: Any, experts: bool) -> None:
    import onnx

    graph = onnx.load(out / "onnx" / "model_kv.onnx", load_external_data=False).graph
    attributes = [{a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
                  for node in graph.node if node.op_type == "GroupQueryAttention"]
    layer_types = getattr(config, "layer_types", None) or \
        ["full_attention"] * config.num_hidden_layers
    assert [a.get("local_window_size", -1) for a in attributes] == [
        config.sliding_window if kind == "sliding_attention" else -1 for kind in layer_types]
    head_dim = getattr(config, "head_dim", None) or \
        config.hidden_size // config.num_attention_heads
    scale = getattr(config, "query_pre_attn_scalar", None) or head_dim
    assert all((a.get("scale") or head_dim**-0.5) == pytest.approx(scale**-0.5)
               for a in attributes)
    assert all(a.get("softcap") == getattr(config, "attn_logit_softcapping", None)
               for a in attributes)
    assert ("MoE" in {node.op_type for node in graph.node}) == experts


def check_config_json(out: Path, row: Decoder, config: Any) -> None:
    """The export's config.json (the clients' layout) is one transformers loads as the class
    the row came from, with the row's `written_back` keys as it had them; GenAI's model type."""
    exported = transformers.AutoConfig.from_pretrained(out)
    assert exported.architectures == [row.model]
    for key in row.written_back:
        assert getattr(exported, key) == getattr(config, key), key
    if row.genai:
        assert json.loads((out / "genai_config.json").read_text())["model"]["type"] == row.genai


# --- refusals: exit 2, one line naming config.json and the key, nothing written ------------

@pytest.mark.parametrize("row, case", [
    pytest.param(row, case, id=f"{row.id}-{case}")
    for row in TABLE.values() if REFUSED in row.checks for case in row.refused])
def test_refusals(row: Decoder, case: str, folders: Folders, tmp_path: Path,
                  monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    changes, parts = row.refused[case]
    changed_source(folders.source(row)[0], changes, tmp_path)
    assert_import_refused(tmp_path, *parts)
