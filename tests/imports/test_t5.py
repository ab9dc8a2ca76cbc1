"""T5, T5 v1.1 / Flan-T5 and mT5 (issue #35): the cards' counts are transformers' class's; the
relative position buckets are transformers'; `zoo import` reads tiny random folders of each
(tests/support/t5_folder.py) through registry/maps/t5.yaml and mt5.yaml, and the zoo's PyTorch model
and its ONNX export give transformers' encoder states and logits on a padded batch, and its greedy
tokens (generation with the cache); text goes in through the folder's tokenizer.json (T5's
SentencePiece unigram with extra ids)."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from export.opening import open_export, open_model
from export.pipeline import export_and_verify
from registry import open_catalog
from registry.params import total_parameters
from registry.sizes import attention_sizes
from runtime.generate import generate
from tests.support.greedy import until_eos
from tests.support.helpers import assert_one_line_error, zoo, zoo_ok
from tests.support.t5_folder import CONFIGS, t5_folder
from zoo.assemble import build_model
from zoo.blocks.relative_bias import relative_buckets
from zoo.files.hf_config import hf_config
from zoo.files.weights import load_built

transformers = pytest.importorskip("transformers")
pytest.importorskip("sentencepiece")

TEXTS = ["First Citizen: we are accounted poor citizens.",
         "What authority surfeits on would relieve us.",
         "Speak, speak."]
STEPS = 10
# mT5's card is T5 v1.1's (its map is `like: t5`): its export would prove nothing more. T5's
# own layout (ReLU, a tied and scaled head) is t5-tiny's, exported in tests/export/test_export.py:
# its import's export runs in make test-slow (the last test here).
EXPORTED = ("t5-v1.1",)


def transformers_count(config: object) -> int:
    """T5ForConditionalGeneration's parameters on the meta device, each tensor once; transformers
    5 ties every T5's head at build time (it unties on loading a file whose head differs), so an
    untied head is counted apart."""
    with torch.device("meta"):
        model = transformers.T5ForConditionalGeneration(config)
    count = sum(parameter.numel() for parameter in model.parameters())
    untied = not getattr(config, "scale_decoder_outputs", config.tie_word_embeddings)
    return count + (model.lm_head.weight.numel() if untied else 0)


@pytest.mark.parametrize(("name", "config", "published"), [
    ("t5-small", {}, 60_506_624),
    ("flan-t5-small", {"num_layers": 8, "num_heads": 6, "d_ff": 1024,
                       "feed_forward_proj": "gated-gelu", "tie_word_embeddings": False},
     76_961_152),
])
def test_card_counts_equal_transformers(name: str, config: dict, published: int) -> None:
    card = open_catalog().get(name)
    expected = transformers_count(transformers.T5Config(vocab_size=32128, d_model=512, d_kv=64,
                                                        **config))
    assert expected == published
    assert total_parameters(card.fields) == published
    model = build_model(card, meta=True)
    assert sum(parameter.numel() for parameter in model.parameters()) == published


@pytest.mark.parametrize("name", ["t5-small", "flan-t5-small", "t5-tiny"])
def test_config_json_is_read_by_transformers_as_the_card(name: str) -> None:
    """An export's config.json (zoo/files/hf_config.py, the map run backwards) is a T5Config
    of the card's sizes, and T5ForConditionalGeneration built from it has the card's count."""
    from transformers import AutoConfig

    card = open_catalog().get(name)
    written = hf_config(card).config
    assert written is not None and written["architectures"] == ["T5ForConditionalGeneration"]
    config = AutoConfig.for_model(**written)
    assert type(config).__name__ == "T5Config"
    assert (config.d_model, config.num_layers, config.num_decoder_layers, config.num_heads,
            config.d_kv, config.d_ff, config.vocab_size) == (
        card["d_model"], card["n_layers"], card["n_layers"], card["n_heads"],
        attention_sizes(card).head_dim, card["d_ff"], card["vocab_size"])
    assert (config.relative_attention_num_buckets, config.relative_attention_max_distance) == (
        card["relative_buckets"], card["relative_max_distance"])
    assert config.is_gated_act == (card["activation"] == "geglu_tanh")
    assert config.scale_decoder_outputs == card["head_scale"]
    assert config.decoder_start_token_id == card["bos_token_id"] == config.pad_token_id
    assert transformers_count(config) == total_parameters(card.fields)


@pytest.mark.parametrize("bidirectional", [True, False])
def test_relative_buckets_equal_transformers(bidirectional: bool) -> None:
    from transformers.models.t5.modeling_t5 import T5Attention

    offsets = torch.arange(-300, 301)[None, :]
    for buckets, distance in ((32, 128), (8, 20), (16, 32)):
        expected = T5Attention._relative_position_bucket(offsets, bidirectional, buckets,
                                                         distance)
        assert torch.equal(relative_buckets(offsets, buckets, distance, bidirectional), expected)


@pytest.fixture(scope="module", params=list(CONFIGS))
def t5(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> dict:
    root = tmp_path_factory.mktemp("t5")
    source, model, tokenizer = t5_folder(root, request.param)
    built = root / "built"
    result = zoo("import", str(source), "-o", str(built))
    assert result.exit_code == 0, result.output
    zoo_model, card = load_built(built)
    exported = None
    if request.param in EXPORTED:
        exported = root / "exported"
        export_and_verify(zoo_model, card, exported, source_folder=built)  # its parity grid
    return {"kind": request.param, "hf": model, "tokenizer": tokenizer, "source": source,
            "built": built, "exported": exported, "zoo": zoo_model, "card": card}


def batch(t5: dict) -> tuple[torch.Tensor, torch.Tensor]:
    encoded = t5["tokenizer"](TEXTS, return_tensors="pt", padding=True)
    return encoded["input_ids"], encoded["attention_mask"]


def test_card_says_what_the_folder_is(t5: dict) -> None:
    card, config = t5["card"], t5["hf"].config
    assert card["position"] == "t5_relative" and card["norm"] == "rmsnorm"
    assert not card["query_scale"] and not card["bias"] and card["final_norm"]
    assert (card["relative_buckets"], card["relative_max_distance"]) == (8, 20)
    assert card["bos_token_id"] == config.decoder_start_token_id == config.pad_token_id
    gated = t5["kind"] != "t5"
    assert card["activation"] == ("geglu_tanh" if gated else "relu")
    assert card["tie_embeddings"] == card["head_scale"] == (not gated)


def test_encoder_states_and_logits_equal_transformers(t5: dict) -> None:
    ids, mask = batch(t5)  # right-padded, as T5's tokenizer pads
    assert not mask.all()
    target = torch.randint(1, t5["card"]["vocab_size"], (len(TEXTS), 7))
    target[:, 0] = t5["card"]["bos_token_id"]
    with torch.no_grad():
        states = t5["hf"].encoder(input_ids=ids, attention_mask=mask).last_hidden_state.numpy()
        expected = t5["hf"](input_ids=ids, attention_mask=mask,
                            decoder_input_ids=target).logits.numpy()
        np.testing.assert_allclose(t5["zoo"].encode(ids, mask).numpy(), states, atol=1e-4,
                                   rtol=0)
        np.testing.assert_allclose(t5["zoo"](ids, target, mask).numpy(), expected, atol=1e-4,
                                   rtol=0)
    if t5["exported"] is None:
        return
    runtime = open_export(t5["exported"])
    encoded = runtime.run("encoder.onnx", {"input_ids": ids.numpy(),
                                           "attention_mask": mask.numpy()})
    real = mask.numpy().astype(bool)  # padded rows' states are not T5's business
    np.testing.assert_allclose(encoded["last_hidden_state"][real], states[real], atol=1e-4,
                               rtol=0)
    feeds = {"input_ids": target.numpy(), "encoder_attention_mask": mask.numpy()}
    card = t5["card"]
    for i in range(card["n_layers"]):
        for kind in ("key", "value"):
            feeds[f"past_key_values.{i}.decoder.{kind}"] = np.zeros(
                (len(TEXTS), card["n_heads"], 0, card["head_dim"]), np.float32)
            feeds[f"past_key_values.{i}.encoder.{kind}"] = encoded[f"present.{i}.encoder.{kind}"]
    logits = runtime.run("decoder.onnx", feeds)["logits"]
    np.testing.assert_allclose(logits, expected, atol=1e-4, rtol=0)


def test_greedy_tokens_equal_transformers_generate(t5: dict) -> None:
    ids, mask = batch(t5)
    eos = t5["card"]["eos_token_id"]
    with torch.no_grad():
        hf = t5["hf"].generate(input_ids=ids, attention_mask=mask, num_beams=1,
                               do_sample=False, max_new_tokens=STEPS)
    expected = [until_eos(row[1:], eos) for row in hf.tolist()]  # row[0]: the start token
    assert len({tuple(row) for row in expected}) > 1  # the sources matter
    engines = [open_model(t5["zoo"], t5["card"])]
    if t5["exported"] is not None:
        engines.append(open_export(t5["exported"]))
    for engine in engines:
        got = generate(engine, ids.numpy(), mask.numpy(), STEPS, eos=eos)
        assert [until_eos(row, eos) for row in got.tolist()] == expected


def test_tokenizer_equals_t5s_with_extra_ids(t5: dict) -> None:
    """A whole source ends with </s>, as T5's tokenizer (and so generation) encodes it."""
    from runtime.files.tokenizer import load_tokenizer, sequence_ids

    ours = load_tokenizer(t5["built"])
    for text in [*TEXTS, "a <extra_id_0> b <extra_id_19> c", "Zounds! qzx"]:
        ids = t5["tokenizer"](text)["input_ids"]
        assert sequence_ids(ours, text) == ids and ids[-1] == t5["card"]["eos_token_id"]
        assert ours.encode(text) == ids[:-1]
        assert ours.decode(ids) == t5["tokenizer"].decode(ids, skip_special_tokens=True)
    assert ours.label(t5["tokenizer"].convert_tokens_to_ids("<extra_id_0>")) == "<extra_id_0>"


@pytest.mark.parametrize("t5", EXPORTED, indirect=True)
def test_zoo_run_generates_transformers_text(t5: dict) -> None:
    text = TEXTS[1]
    output = zoo_ok("run", str(t5["exported"]), "--text", text, "--max-new-tokens", str(STEPS))
    encoded = t5["tokenizer"]([text], return_tensors="pt")
    with torch.no_grad():
        hf = t5["hf"].generate(**encoded, do_sample=False, max_new_tokens=STEPS)
    assert output == t5["tokenizer"].decode(hf[0], skip_special_tokens=True) + "\n"


@pytest.mark.slow
@pytest.mark.parametrize("t5", ["t5"], indirect=True)
def test_t5s_own_layout_exports_with_transformers_logits_tokens_and_text(t5: dict,
                                                                         tmp_path: Path) -> None:
    """The checks above with an export, on T5's own layout."""
    exported = tmp_path / "exported"
    export_and_verify(t5["zoo"], t5["card"], exported, source_folder=t5["built"])
    with_export = {**t5, "exported": exported}
    test_encoder_states_and_logits_equal_transformers(with_export)
    test_greedy_tokens_equal_transformers_generate(with_export)
    test_zoo_run_generates_transformers_text(with_export)


def edited_folder(t5: dict, tmp_path: Path, **changes: object) -> Path:
    folder = tmp_path / "edited"
    shutil.copytree(t5["source"], folder)
    config = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    config.update(changes)
    (folder / "config.json").write_text(json.dumps(config), encoding="utf-8")
    return folder


@pytest.mark.parametrize(("changes", "expected"), [
    ({"feed_forward_proj": "gated-relu"}, "feed_forward_proj='gated-relu' is not supported"),
    ({"num_decoder_layers": 3}, "num_decoder_layers=3 (needs num_layers=2"),
])
@pytest.mark.parametrize("t5", ["t5"], indirect=True)  # one layout is enough
def test_what_the_zoo_cannot_compute_is_refused_by_name(t5: dict, tmp_path: Path,
                                                        changes: dict, expected: str) -> None:
    result = zoo("import", str(edited_folder(t5, tmp_path, **changes)), "-o",
                 str(tmp_path / "out"))
    assert_one_line_error(result, "config.json", expected)
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("task", ["copy", "reverse"])
def test_t5_tiny_trains_on_the_sequence_tasks(task: str, tmp_path: Path) -> None:
    """`zoo train t5-tiny --task copy|reverse` runs as the paper's card does, and learns."""
    output = zoo_ok("train", "t5-tiny", "--task", task, "--steps", "60", "--warmup", "20",
                    "--batch-size", "16", "--checkpoint-every", "60", "-o",
                    str(tmp_path / "trained"))
    found = re.search(r"loss ([\d.]+) -> ([\d.]+)", output)
    assert found is not None, output
    assert float(found[2]) < float(found[1]) - 0.3
    trained, card = load_built(tmp_path / "trained")
    assert card["position"] == "t5_relative" and card.name == "t5-tiny"
    assert any(not torch.equal(parameter, fresh) for parameter, fresh in zip(
        trained.parameters(), build_model(open_catalog().get("t5-tiny")).parameters(),
        strict=True))


@pytest.mark.parametrize(("name", "overrides", "expected"), [
    ("t5-tiny", {"relative_max_distance": 8},
     "relative_max_distance=8 should exceed relative_buckets // 2 = 8"),
    ("t5-tiny", {"tie_embeddings": False}, "head_scale applies only to a tied head"),
    ("t5-tiny", {"share_embeddings": True, "target_vocab_size": 32},
     "share_embeddings=true needs one vocabulary"),
    ("gpt-tiny", {"share_embeddings": True}, "share_embeddings applies only to family "
                                             "encoder-decoder"),
])
def test_a_card_the_blocks_cannot_build_is_refused(name: str, overrides: dict,
                                                   expected: str) -> None:
    from registry.errors import CardError
    from registry.schema import validate

    with pytest.raises(CardError, match=re.escape(f"x.yaml: {expected}")):
        validate({**open_catalog().get(name).fields, **overrides}, "x.yaml")
