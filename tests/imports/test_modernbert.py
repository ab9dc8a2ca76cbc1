"""ModernBERT (registry/maps/modernbert.yaml, cards modernbert-*): counts against transformers'
classes on the meta device, and imported tiny random ModernBertModel / ForMaskedLM /
ForSequenceClassification folders computing what transformers computes, with sequences longer
than the local window and a padded batch. transformers is the reference: no download."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from registry.params import total_parameters
from tests.conftest import card
from tests.support.helpers import assert_one_line_error, imported_folders, zoo
from tests.support.hf_decoders import randomise
from zoo.assemble import build_model
from zoo.files.weights import load_built

transformers = pytest.importorskip("transformers")

ATOL = 1e-4
WINDOW = 8  # local_attention: 4 tokens either side, so a 24-token row really slides
TINY = dict(num_hidden_layers=4, hidden_size=32, num_attention_heads=4, intermediate_size=48,
            max_position_embeddings=64, vocab_size=100, local_attention=WINDOW,
            global_rope_theta=1000.0, local_rope_theta=50.0, pad_token_id=0,
            bos_token_id=1, eos_token_id=2, cls_token_id=1, sep_token_id=2,
            attn_implementation="eager")
LARGE = dict(hidden_size=1024, num_attention_heads=16, num_hidden_layers=28,
             intermediate_size=2624)


@pytest.mark.parametrize(("name", "config", "published"),
                         [("modernbert-base", {}, 149_655_232),
                          ("modernbert-large", LARGE, 395_881_664)])
def test_counts_are_transformers(name: str, config: dict, published: int) -> None:
    with torch.device("meta"):
        reference = transformers.ModernBertForMaskedLM(transformers.ModernBertConfig(**config))
        model = build_model(card(name), meta=True)
    assert sum(p.numel() for p in reference.parameters()) == published
    assert sum(p.numel() for p in model.parameters()) == published
    assert total_parameters(card(name).fields) == published


def test_classifier_count_is_transformers() -> None:
    with torch.device("meta"):
        reference = transformers.ModernBertForSequenceClassification(
            transformers.ModernBertConfig(num_labels=3))
    fields = card("modernbert-base", mlm_head=False, pooling="cls", num_labels=3).fields
    assert total_parameters(fields) == sum(p.numel() for p in reference.parameters())


@pytest.fixture(scope="module")
def sources(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Path, torch.nn.Module]]:
    root = tmp_path_factory.mktemp("modernbert")
    torch.manual_seed(0)
    config = transformers.ModernBertConfig
    made = {
        "model": transformers.ModernBertModel(config(**TINY)),
        "mlm": transformers.ModernBertForMaskedLM(config(**TINY)),
        "cls": transformers.ModernBertForSequenceClassification(
            config(**TINY, num_labels=3, classifier_pooling="cls")),
        "mean": transformers.ModernBertForSequenceClassification(
            config(**TINY, num_labels=2, classifier_pooling="mean", classifier_bias=True,
                   id2label={0: "no", 1: "yes"}, label2id={"no": 0, "yes": 1})),
    }
    folders = {}
    for name, model in made.items():
        # weights far from the init, norms' included, so a missed norm or half shows
        randomise(model, std=0.3, norm_mean=0.0, seed=None)
        model.save_pretrained(root / name, safe_serialization=True)
        folders[name] = (root / name, model)
    return folders


@pytest.fixture(scope="module")
def imported(sources: dict, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return imported_folders(sources, tmp_path_factory.mktemp("imported"))


def _padded_batch() -> tuple[torch.Tensor, torch.Tensor]:
    """Rows of 24 and 17 real tokens (3 and 2 windows), padded on the right as ModernBERT's
    tokenizer pads."""
    ids = torch.randint(3, 100, (2, 24), generator=torch.Generator().manual_seed(1))
    mask = torch.ones_like(ids)
    mask[1, 17:] = 0
    return ids.masked_fill(mask == 0, 0), mask


def test_imported_card_is_modernberts(imported: dict) -> None:
    _, built = load_built(imported["mlm"])
    assert (built["attention_pattern"], built["sliding_window"]) == ("GLL", WINDOW)
    assert (built["rope_theta"], built["rope_theta_local"]) == (1000.0, 50.0)
    assert built["activation"] == "geglu" and not built["norm_bias"] and built["mlm_head"]


@pytest.mark.parametrize("name", ["model", "mlm", "cls", "mean"])
def test_outputs_match_transformers(name: str, sources: dict, imported: dict) -> None:
    _, reference = sources[name]
    model, built = load_built(imported[name])
    ids, mask = _padded_batch()
    real = mask.bool()  # padded positions' outputs mean nothing in either
    with torch.no_grad():
        ours = model(ids, mask)
        out = reference(input_ids=ids, attention_mask=mask, output_hidden_states=True)
        alone = model(ids[1:, :17])  # the padded row alone: padding changes nothing
    torch.testing.assert_close(ours["last_hidden_state"][real], out.hidden_states[-1][real]
                               if name != "model" else out.last_hidden_state[real],
                               atol=ATOL, rtol=0)
    if name == "mlm":
        torch.testing.assert_close(ours["logits"][real], out.logits[real], atol=ATOL, rtol=0)
    if name in ("cls", "mean"):
        assert built["pooling"] == name and built["num_labels"] == len(out.logits[0])
        torch.testing.assert_close(ours["logits"], out.logits, atol=ATOL, rtol=0)
    torch.testing.assert_close(alone["last_hidden_state"][0], ours["last_hidden_state"][1, :17],
                               atol=ATOL, rtol=0)


def test_labels_come_from_id2label(imported: dict) -> None:
    _, built = load_built(imported["mean"])
    assert built["labels"] == ["no", "yes"] and built["head_bias"]


def _edit(sources: dict, name: str, tmp_path: Path, **changes: object) -> Path:
    import shutil

    folder = tmp_path / "source"
    shutil.copytree(sources[name][0], folder)
    path = folder / "config.json"
    config = json.loads(path.read_text())
    config.update(changes)
    path.write_text(json.dumps(config))
    return folder


@pytest.mark.parametrize(("changes", "parts"), [
    ({"decoder_bias": False}, ("decoder_bias=False", "needs True")),
    ({"classifier_activation": "silu"}, ("classifier_activation='silu'",)),
    ({"hidden_activation": "silu"}, ("hidden_activation='silu' is not supported",)),
    ({"layer_types": ["full_attention", "chunked_attention", "sliding_attention",
                      "full_attention"]}, ("layer_types has chunked_attention",)),
    ({"rope_parameters": {"full_attention": {"rope_type": "linear", "factor": 2.0,
                                             "rope_theta": 1.0}}},
     ("rope_parameters.full_attention.rope_type='linear'",)),
])
def test_refuses_what_the_zoo_does_not_compute(changes: dict, parts: tuple, sources: dict,
                                                tmp_path: Path) -> None:
    folder = _edit(sources, "mlm", tmp_path, **changes)
    assert_one_line_error(zoo("import", str(folder), "-o", str(tmp_path / "out")), *parts)


def test_hub_style_config_reads_every_third_layer_global(sources: dict, tmp_path: Path) -> None:
    """The Hub's files say global_attn_every_n_layers and the two thetas by name."""
    folder = _edit(sources, "model", tmp_path, global_attn_every_n_layers=2,
                   global_rope_theta=7.0, local_rope_theta=3.0)
    config = json.loads((folder / "config.json").read_text())
    for key in ("layer_types", "rope_parameters"):
        config.pop(key)
    (folder / "config.json").write_text(json.dumps(config))
    from zoo.files.importers import import_checkpoint

    import_checkpoint(folder, tmp_path / "out")
    _, built = load_built(tmp_path / "out")
    assert (built["attention_pattern"], built["rope_theta"], built["rope_theta_local"]) == (
        "GL", 7.0, 3.0)


def test_sentence_transformers_folder_on_modernbert(sources: dict, tmp_path: Path) -> None:
    """modules.json over a ModernBertModel body with mean pooling and Normalize: the vector is
    sentence-transformers' formula on transformers' hidden states."""
    import shutil

    folder, reference = sources["model"]
    root = tmp_path / "st"
    shutil.copytree(folder, root)
    modules = [{"idx": 0, "name": "0", "path": "",
                "type": "sentence_transformers.models.Transformer"},
               {"idx": 1, "name": "1", "path": "1_Pooling",
                "type": "sentence_transformers.models.Pooling"},
               {"idx": 2, "name": "2", "path": "2_Normalize",
                "type": "sentence_transformers.models.Normalize"}]
    (root / "modules.json").write_text(json.dumps(modules))
    (root / "1_Pooling").mkdir()
    (root / "2_Normalize").mkdir()
    (root / "1_Pooling" / "config.json").write_text(json.dumps({
        "word_embedding_dimension": 32, "pooling_mode_mean_tokens": True}))
    from zoo.files.importers import import_checkpoint

    import_checkpoint(root, tmp_path / "out")
    model, _ = load_built(tmp_path / "out")
    ids, mask = _padded_batch()
    with torch.no_grad():
        ours = model(ids, mask)["sentence_embedding"]
        hidden = reference(input_ids=ids, attention_mask=mask).last_hidden_state
    weights = mask.unsqueeze(-1).float()
    expected = torch.nn.functional.normalize((hidden * weights).sum(1) / weights.sum(1), dim=-1)
    torch.testing.assert_close(ours, expected, atol=ATOL, rtol=0)


def test_local_layers_attend_within_the_window() -> None:
    """What `zoo attention` draws: a local layer's maps are zero beyond window // 2 either
    side, a global layer's are not."""
    from zoo.blocks.attention import recorded_attentions

    tiny = card("modernbert-tiny")
    model = build_model(tiny)
    ids = torch.randint(3, 250, (1, 40), generator=torch.Generator().manual_seed(2))
    with torch.no_grad(), recorded_attentions(model.attention_groups()) as maps:
        model(ids)
    distance = (torch.arange(40)[:, None] - torch.arange(40)[None, :]).abs()
    beyond = distance > tiny["sliding_window"] // 2
    layers = [calls[0][0] for calls in maps["attentions"]]  # (heads, T, T) each
    assert layers[0][:, beyond].abs().max() > 0  # layer 0: global
    for local in layers[1:]:
        assert local[:, beyond].abs().max() == 0


def test_mlm_trains_modernbert_tiny(tmp_path: Path) -> None:
    import numpy as np

    from zoo.training.train import TrainOptions, train

    tiny = card("modernbert-tiny")
    result = train(build_model(tiny), tiny, TrainOptions(
        task="mlm", out=tmp_path / "mlm", steps=40, batch_size=8, block_size=48, lr=3e-3,
        checkpoint_every=40, seed=3))
    assert np.mean(result["losses"][-5:]) < np.mean(result["losses"][:5]) - 0.5


def test_imported_modernbert_becomes_a_classifier(imported: dict, tmp_path: Path) -> None:
    """Fine-tuning an import: the body kept tensor for tensor, the MLM head dropped, and
    ModernBERT's classifier head (dense, norm, linear) new."""
    from zoo.training.classify import prepare_classifier

    rows = [{"text": text, "label": label} for text, label in
            (("aa", "x"), ("bb", "y"), ("ab", "x"), ("ba", "y"))]
    data = tmp_path / "rows.jsonl"
    data.write_text("".join(json.dumps(row) + "\n" for row in rows))
    source, source_card = load_built(imported["mlm"])
    theirs = {name: tensor.clone() for name, tensor in source.state_dict().items()}
    model, new_card, record = prepare_classifier(source, source_card, data, 1, "mlm")
    assert (new_card["num_labels"], new_card["pooling"]) == (2, "cls")
    assert sorted(record["initialised"]) == [
        "classifier.linear.bias", "classifier.linear.weight", "classifier.norm.weight",
        "classifier.transform.weight"]
    assert all(name.startswith("mlm_head.") for name in record["dropped"])
    ours = model.state_dict()
    assert record["kept"] and all(torch.equal(ours[n], theirs[n]) for n in record["kept"])


@pytest.mark.parametrize(("overrides", "architecture"), [
    ({}, "ModernBertForMaskedLM"),
    ({"mlm_head": False, "pooling": "mean", "num_labels": 2},
     "ModernBertForSequenceClassification"),
])
def test_config_json_is_transformers_modernbert(overrides: dict, architecture: str) -> None:
    """The config.json an export carries, read by transformers' own ModernBertConfig."""
    from zoo.files.hf_config import hf_config

    tiny = card("modernbert-tiny", **overrides)
    written = hf_config(tiny).config
    assert written["architectures"] == [architecture]
    config = transformers.ModernBertConfig(**written)
    assert config.layer_types == ["full_attention", "sliding_attention", "sliding_attention"]
    assert config.sliding_window == tiny["sliding_window"] // 2  # transformers' half window
    assert config.rope_parameters["full_attention"]["rope_theta"] == tiny["rope_theta"]
    assert config.rope_parameters["sliding_attention"]["rope_theta"] == tiny["rope_theta_local"]
    assert not config.norm_bias and config.hidden_activation == "gelu"
    assert config.classifier_pooling == tiny["pooling"] or not tiny["num_labels"]


@pytest.mark.parametrize(("overrides", "message"), [
    ({"norm": "rmsnorm", "norm_bias": False}, "norm_bias=false applies only to norm layernorm"),
    ({"first_attention_norm": False}, "first_attention_norm=false applies only to "
                                      "norm_placement pre"),
])
def test_norm_options_are_refused_where_they_mean_nothing(overrides: dict, message: str
                                                          ) -> None:
    from registry.errors import CardError

    with pytest.raises(CardError, match=message):
        card("bert-tiny", **overrides)  # bert-tiny: post-norm
