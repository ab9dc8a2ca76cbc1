"""`zoo import`: Hugging Face GPT-2 and BERT folders become built zoo models that compute what
transformers computes, export with parity, and every bad folder is refused in one line.

`transformers` is a test-only dependency: it makes small random reference models here."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from tests.support.helpers import assert_one_line_error, imported_folders, zoo
from tests.support.hf_decoders import randomise
from zoo.files.importers import RECORD
from zoo.files.weights import load_built

transformers = pytest.importorskip("transformers")
tokenizers = pytest.importorskip("tokenizers")

ATOL = 1e-4
GPT2 = dict(n_layer=2, n_embd=32, n_head=4, n_positions=64, vocab_size=100)
BERT = dict(num_hidden_layers=2, hidden_size=32, num_attention_heads=4, intermediate_size=64,
            max_position_embeddings=64, vocab_size=100)


def rewrite(folder: Path, add: dict[str, torch.Tensor] | None = None,
            drop: tuple[str, ...] = ()) -> None:
    path = folder / "model.safetensors"
    tensors = {name: t for name, t in load_file(str(path)).items() if name not in drop}
    save_file({**tensors, **(add or {})}, str(path), metadata={"format": "pt"})


def word_tokenizer(path: Path) -> None:
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.WordLevel(unk_token="[UNK]"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    trainer = trainers.WordLevelTrainer(special_tokens=["[PAD]", "[UNK]", "[MASK]"])
    tokenizer.train_from_iterator(["the cat sat on the mat", "a dog ate the bone"], trainer)
    tokenizer.save(str(path))


@pytest.fixture(scope="module")
def sources(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Path, torch.nn.Module]]:
    """Reference models and the folders they saved, one per published shape."""
    root = tmp_path_factory.mktemp("hf")
    torch.manual_seed(0)
    made = {
        "gpt2-lm": transformers.GPT2LMHeadModel(transformers.GPT2Config(**GPT2)),
        "gpt2-old": transformers.GPT2Model(
            transformers.GPT2Config(**GPT2, bos_token_id=98, eos_token_id=98)),
        "bert-mlm": transformers.BertForMaskedLM(transformers.BertConfig(**BERT)),
        "bert-base": transformers.BertModel(transformers.BertConfig(**BERT)),
    }
    folders = {}
    for name, model in made.items():
        # weights far from the 0.02 init, so a wrong GELU, eps or scale shows in the outputs
        randomise(model, std=0.3, norm_mean=0.0, seed=None)
        model.save_pretrained(root / name, safe_serialization=True)
        folders[name] = (root / name, model)
    causal = torch.tril(torch.ones(64, 64, dtype=torch.bool))[None, None]
    buffers = {f"h.{i}.attn.bias": causal.clone() for i in range(2)}
    buffers.update({f"h.{i}.attn.masked_bias": torch.tensor(-1e4) for i in range(2)})
    rewrite(root / "gpt2-old", buffers)
    rewrite(root / "bert-base", {"embeddings.position_ids": torch.arange(64)[None]})
    word_tokenizer(root / "bert-mlm" / "tokenizer.json")
    return folders


@pytest.fixture(scope="module")
def imported(sources: dict, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return imported_folders(sources, tmp_path_factory.mktemp("imported"))


def record(folder: Path) -> dict:
    return json.loads((folder / RECORD).read_text(encoding="utf-8"))


# --- the same outputs as transformers ------------------------------------------------------

def left_padded_batch() -> tuple[torch.Tensor, torch.Tensor]:
    ids = torch.randint(0, 100, (2, 9), generator=torch.Generator().manual_seed(1))
    mask = torch.ones_like(ids)
    mask[1, :3] = 0
    return ids, mask


@pytest.mark.parametrize("name", ["gpt2-lm", "gpt2-old"])
def test_gpt2_logits_match_transformers(name: str, sources: dict, imported: dict) -> None:
    _, reference = sources[name]
    model, card = load_built(imported[name])
    assert card["activation"] == "gelu_tanh" and card["tie_embeddings"]
    ids, mask = left_padded_batch()
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    with torch.no_grad():
        ours, _ = model(ids, mask, positions)
        out = reference(input_ids=ids, attention_mask=mask, position_ids=positions)
        theirs = out.logits if name == "gpt2-lm" else out.last_hidden_state @ reference.wte.weight.T
        plain, _ = model(ids)
        plain_theirs = reference(input_ids=ids)
    real = mask.bool()  # padded queries see no key at all: their outputs mean nothing
    torch.testing.assert_close(ours[real], theirs[real], atol=ATOL, rtol=0)
    if name == "gpt2-lm":
        torch.testing.assert_close(plain, plain_theirs.logits, atol=ATOL, rtol=0)


@pytest.mark.parametrize("name", ["bert-mlm", "bert-base"])
def test_bert_outputs_match_transformers(name: str, sources: dict, imported: dict) -> None:
    _, reference = sources[name]
    model, card = load_built(imported[name])
    ids, mask = left_padded_batch()
    mask = mask.flip(-1)  # BERT pads on the right
    types = torch.zeros_like(ids)
    types[:, 5:] = 1
    # Real tokens only: at padding positions zoo numbers positions by real tokens (so left
    # padding works too) and transformers by column; neither output there is meaningful.
    real = mask.bool()
    with torch.no_grad():
        ours = model(ids, mask, types)
        if name == "bert-mlm":
            out = reference(input_ids=ids, attention_mask=mask, token_type_ids=types,
                            output_hidden_states=True)
            torch.testing.assert_close(ours["logits"][real], out.logits[real], atol=ATOL, rtol=0)
            hidden, pooled = out.hidden_states[-1], None
        else:
            out = reference(input_ids=ids, attention_mask=mask, token_type_ids=types)
            hidden, pooled = out.last_hidden_state, out.pooler_output
    torch.testing.assert_close(ours["last_hidden_state"][real], hidden[real], atol=ATOL, rtol=0)
    assert ("pooler_output" in ours) == (pooled is not None)
    if pooled is not None:
        torch.testing.assert_close(ours["pooler_output"], pooled, atol=ATOL, rtol=0)


def test_imported_gpt2_exports_with_parity(sources: dict, imported: dict,
                                           tmp_path: Path) -> None:
    from export.opening import open_export
    from export.pipeline import export_and_verify
    from zoo.files.sources import load_source

    model, card = load_source(str(imported["gpt2-lm"]))
    report = export_and_verify(model, card, tmp_path / "onnx")  # raises unless parity passed
    assert {row.output for row in report.rows} == {"logits", "present.*"}
    # The exported graph against transformers itself, not against our own PyTorch model.
    ids, _ = left_padded_batch()
    past = torch.zeros(2, card["n_heads"], 0, card["d_model"] // card["n_heads"])
    feeds = {"input_ids": ids.numpy(), "attention_mask": torch.ones_like(ids).numpy(),
             "position_ids": torch.arange(ids.shape[1]).expand_as(ids).numpy(),
             **{f"past_key_values.{i}.{kind}": past.numpy()
                for i in range(card["n_layers"]) for kind in ("key", "value")}}
    logits = open_export(tmp_path / "onnx").run("onnx/model.onnx", feeds)["logits"]
    with torch.no_grad():
        theirs = sources["gpt2-lm"][1](input_ids=ids).logits
    torch.testing.assert_close(torch.from_numpy(logits), theirs, atol=ATOL, rtol=1e-3)


# slow: imported BERT folders export through the CLI in test_import_sentence.py by default
@pytest.mark.slow
def test_imported_bert_exports_through_the_cli(imported: dict, tmp_path: Path) -> None:
    result = zoo("export", str(imported["bert-mlm"]), "--onnx", "-o", str(tmp_path / "onnx"))
    assert result.exit_code == 0, result.output
    assert (tmp_path / "onnx" / "onnx/model.onnx").is_file()


# --- what the card and source.json record --------------------------------------------------

def test_card_records_the_heads_the_checkpoint_has(imported: dict) -> None:
    expected = {"bert-base": (False, True), "bert-mlm": (True, False)}
    for name, (mlm_head, pooler) in expected.items():
        _, card = load_built(imported[name])
        assert (card["mlm_head"], card["pooler"]) == (mlm_head, pooler)
        assert record(imported[name])["heads"] == {"mlm_head": mlm_head, "pooler": pooler,
                                                    "tie_embeddings": True}
    _, card = load_built(imported["gpt2-old"])
    assert card["tie_embeddings"] and card["family"] == "decoder"


def test_source_json_records_the_source(sources: dict, imported: dict) -> None:
    for name, (folder, _) in sources.items():
        data = record(imported[name])
        assert data["source"] == str(folder.resolve())
        digest = hashlib.sha256((folder / "model.safetensors").read_bytes()).hexdigest()
        assert data["safetensors"]["sha256"] == digest
        assert data["extends"] == ("gpt2-small" if name.startswith("gpt2") else "bert-base")
        assert data["overrides"]["d_model"] == 32 and data["overrides"]["n_layers"] == 2
    assert record(imported["gpt2-lm"])["prefixes"] == ["transformer."]
    assert record(imported["gpt2-old"])["prefixes"] == []
    assert record(imported["gpt2-old"])["ignored"] == sorted(
        f"h.{i}.attn.{buffer}" for i in range(2) for buffer in ("bias", "masked_bias"))
    assert record(imported["bert-base"])["ignored"] == ["embeddings.position_ids"]
    assert record(imported["bert-mlm"])["prefixes"] == ["bert."]


def test_gpt2_token_ids_and_bert_mask_token(sources: dict, imported: dict) -> None:
    _, card = load_built(imported["gpt2-lm"])  # 50256 does not fit a 100-token vocabulary
    assert (card["bos_token_id"], card["eos_token_id"], card["pad_token_id"]) == (99, 99, 99)
    _, card = load_built(imported["gpt2-old"])  # ids that fit are taken from config.json
    assert (card["bos_token_id"], card["eos_token_id"], card["pad_token_id"]) == (98, 98, 99)
    _, card = load_built(imported["bert-mlm"])
    folder = sources["bert-mlm"][0]
    assert (imported["bert-mlm"] / "tokenizer.json").read_bytes() == \
        (folder / "tokenizer.json").read_bytes()
    assert card["mask_token_id"] == 2 and card["pad_token_id"] == 0  # [MASK] in tokenizer.json
    assert not (imported["bert-base"] / "tokenizer.json").exists()


def test_tied_lm_head_is_dropped_when_equal(sources: dict, tmp_path: Path) -> None:
    folder = shutil.copytree(sources["gpt2-lm"][0], tmp_path / "src")
    wte = load_file(str(folder / "model.safetensors"))["transformer.wte.weight"]
    rewrite(folder, {"lm_head.weight": wte.clone()})
    result = zoo("import", str(folder), "-o", str(tmp_path / "out"))
    assert result.exit_code == 0, result.output
    assert record(tmp_path / "out")["tied"] == ["lm_head.weight"]


# --- refusals: exit 2, one line naming the file and the tensors, nothing written -----------

def copy_source(sources: dict, name: str, tmp_path: Path) -> Path:
    return shutil.copytree(sources[name][0], tmp_path / "src")


def edit_config(folder: Path, **changes: object) -> None:
    path = folder / "config.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), **changes}))


def break_unknown_layout(folder: Path) -> None:
    edit_config(folder, model_type="mamba", architectures=["MambaForCausalLM"])


def break_pickle_only(folder: Path) -> None:
    (folder / "model.safetensors").unlink()
    (folder / "pytorch_model.bin").write_bytes(b"never unpickled")


def break_missing(folder: Path) -> None:
    rewrite(folder, drop=("transformer.h.1.mlp.c_fc.weight", "transformer.ln_f.bias"))


def break_unexpected(folder: Path) -> None:
    rewrite(folder, {"transformer.h.0.attn.rotary.weight": torch.zeros(2),
                     "transformer.h.2.ln_1.weight": torch.zeros(32)})


def break_untied_head(folder: Path) -> None:
    rewrite(folder, {"lm_head.weight": torch.randn(100, 32)})


def break_misshaped(folder: Path) -> None:
    edit_config(folder, n_embd=64)


BROKEN = {
    "unknown-layout": (break_unknown_layout, ["config.json", "'mamba'", "not a known layout"]),
    "pickle-only": (break_pickle_only, ["pytorch_model.bin", "pickle checkpoints are not loaded; "
                                        "convert to safetensors"]),
    "missing-tensors": (break_missing, ["model.safetensors", "missing: h.1.mlp.c_fc.weight, "
                                        "ln_f.bias"]),
    "unexpected-tensors": (break_unexpected, ["model.safetensors", "unexpected: "
                                              "transformer.h.0.attn.rotary.weight, "
                                              "transformer.h.2.ln_1.weight"]),
    "untied-head": (break_untied_head, ["lm_head.weight differs from transformer.wte.weight"]),
    "misshaped": (break_misshaped, ["model.safetensors", "mis-shaped", "transformer.h.0.attn."
                                    "c_attn.weight (32, 96) != (64, 192)", "(+"]),
    "no-config": (lambda f: (f / "config.json").unlink(), ["config.json", "no such file"]),
    "corrupt-config": (lambda f: (f / "config.json").write_text("{not json"),
                       ["config.json", "not valid JSON"]),
    "corrupt-weights": (lambda f: (f / "model.safetensors").write_bytes(b"\x00" * 40),
                        ["model.safetensors", "not a readable safetensors file"]),
    "bad-activation": (lambda f: edit_config(f, activation_function="swish"),
                       ["config.json", "activation_function='swish'", "gelu_new"]),
    "unsupported-setting": (lambda f: edit_config(f, scale_attn_by_inverse_layer_idx=True),
                            ["config.json", "scale_attn_by_inverse_layer_idx=True"]),
    "heads-do-not-divide": (lambda f: edit_config(f, n_head=5),
                            ["config.json", "n_heads=5 does not divide d_model=32"]),
}


@pytest.mark.parametrize("case", sorted(BROKEN))
def test_refusals(case: str, sources: dict, tmp_path: Path,
                  monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    folder = copy_source(sources, "gpt2-lm", tmp_path)
    breaker, parts = BROKEN[case]
    breaker(folder)
    before = sorted(p.name for p in tmp_path.iterdir())
    result = zoo("import", "src", "-o", "out")
    assert_one_line_error(result, *parts)
    assert sorted(p.name for p in tmp_path.iterdir()) == before  # no OUT, no staging left


def test_refuses_existing_out_without_force(sources: dict, tmp_path: Path,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "keep.txt").write_text("mine")
    folder = sources["bert-base"][0]
    assert_one_line_error(zoo("import", str(folder), "-o", "out"), "out already exists", "--force")
    assert (tmp_path / "out" / "keep.txt").read_text() == "mine"
    result = zoo("import", str(folder), "-o", "out", "--force")
    assert result.exit_code == 0, result.output
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == \
        ["config.yaml", "model.safetensors", "source.json"]


def test_refuses_to_replace_the_source(sources: dict, tmp_path: Path) -> None:
    folder = copy_source(sources, "gpt2-old", tmp_path)
    before = sorted(p.name for p in folder.iterdir())
    result = zoo("import", str(folder), "-o", str(folder), "--force")
    assert_one_line_error(result, "the output would replace the source folder")
    assert sorted(p.name for p in folder.iterdir()) == before


def test_refuses_a_tokenizer_larger_than_the_vocabulary(sources: dict, tmp_path: Path) -> None:
    from tokenizers import Tokenizer, models

    folder = copy_source(sources, "bert-base", tmp_path)
    words = {f"w{i}": i for i in range(150)}
    Tokenizer(models.WordLevel(words, unk_token="w0")).save(str(folder / "tokenizer.json"))
    result = zoo("import", str(folder), "-o", str(tmp_path / "out"))
    assert_one_line_error(result, "tokenizer.json", "150 tokens", "vocab_size is 100")
    assert not (tmp_path / "out").exists()
