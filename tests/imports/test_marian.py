"""MarianMT folders (issue #12): `zoo import` reads a Hugging Face MarianMTModel with random tiny
weights and a tiny sentencepiece model trained here on the shipped text; the zoo's PyTorch model
and its ONNX export give transformers' logits, and its greedy and 4-beam tokens equal
`MarianMTModel.generate`'s. Text goes in and out through the same sentencepiece files."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
import torch
from click.testing import CliRunner

from cli import main
from export.opening import open_export, open_model
from export.pipeline import export_and_verify
from runtime.generate import generate
from runtime.sampling import Sampling
from tests.support.greedy import until_eos
from tests.support.marian_folder import SHIPPED, marian_folder, marian_vocabulary, train_spm
from zoo.files.weights import load_built

transformers = pytest.importorskip("transformers")
spm = pytest.importorskip("sentencepiece")

TEXTS = ["First Citizen: we are accounted poor citizens.",
         "What authority surfeits on would relieve us.",
         "Speak, speak."]
STEPS = 12


@pytest.fixture(scope="module")
def marian(tmp_path_factory: pytest.TempPathFactory) -> dict:
    root = tmp_path_factory.mktemp("marian")
    source, model = marian_folder(root)
    pad = model.config.pad_token_id
    tokenizer = transformers.MarianTokenizer(*(str(source / name) for name in (
        "source.spm", "target.spm", "vocab.json")))
    built = root / "built"
    result = CliRunner().invoke(main, ["import", str(source), "-o", str(built)])
    assert result.exit_code == 0, result.output
    exported = root / "exported"
    zoo_model, card = load_built(built)
    export_and_verify(zoo_model, card, exported, source_folder=built)  # with its parity grid
    return {"hf": model, "tokenizer": tokenizer, "source": source, "built": built,
            "exported": exported, "card": card, "zoo": zoo_model, "pad": pad}


def batch(marian: dict) -> tuple[torch.Tensor, torch.Tensor]:
    encoded = marian["tokenizer"](TEXTS, return_tensors="pt", padding=True)
    return encoded["input_ids"], encoded["attention_mask"]


def test_card_says_what_differs_from_the_paper(marian: dict) -> None:
    card = marian["card"]
    assert card["position"] == "sinusoidal_halves" and card["activation"] == "silu"
    assert card["output_bias"] and card["tie_embeddings"] and card["target_vocab_size"] is None
    assert card["bos_token_id"] == marian["pad"] and card["eos_token_id"] == 0
    assert card["norm_placement"] == "post" and not card["final_norm"]
    assert not card["scale_embeddings"] and card["max_positions"] == 64


def test_logits_equal_transformers_through_pytorch_and_onnx_runtime(marian: dict) -> None:
    ids, mask = batch(marian)  # right-padded, as MarianTokenizer pads
    target = torch.randint(1, marian["card"]["vocab_size"], (len(TEXTS), 7))
    target[:, 0] = marian["pad"]  # the decoder start token
    with torch.no_grad():
        expected = marian["hf"](input_ids=ids, attention_mask=mask,
                                decoder_input_ids=target).logits.numpy()
        ours = marian["zoo"](ids, target, mask).numpy()
    np.testing.assert_allclose(ours, expected, atol=1e-4, rtol=0)
    runtime = open_export(marian["exported"])
    encoded = runtime.run("encoder.onnx", {"input_ids": ids.numpy(),
                                           "attention_mask": mask.numpy()})
    feeds = {"input_ids": target.numpy(), "encoder_attention_mask": mask.numpy()}
    shape = (len(TEXTS), 4, 0, 8)
    for i in range(marian["card"]["n_layers"]):
        for kind in ("key", "value"):
            feeds[f"past_key_values.{i}.decoder.{kind}"] = np.zeros(shape, np.float32)
            feeds[f"past_key_values.{i}.encoder.{kind}"] = encoded[f"present.{i}.encoder.{kind}"]
    logits = runtime.run("decoder.onnx", feeds)["logits"]
    np.testing.assert_allclose(logits, expected, atol=1e-4, rtol=0)


@pytest.mark.parametrize("beams", [1, 4])
def test_tokens_equal_marian_generate(marian: dict, beams: int) -> None:
    ids, mask = batch(marian)
    eos = marian["card"]["eos_token_id"]
    with torch.no_grad():
        hf = marian["hf"].generate(input_ids=ids, attention_mask=mask, num_beams=beams,
                                   do_sample=False, max_new_tokens=STEPS)
    expected = [until_eos(row[1:], eos) for row in hf.tolist()]  # row[0]: the start token
    assert len({tuple(row) for row in expected}) > 1  # the sources matter
    for engine in (open_export(marian["exported"]), open_model(marian["zoo"], marian["card"])):
        got = generate(engine, ids.numpy(), mask.numpy(), STEPS, Sampling(beams=beams), eos)
        assert [until_eos(row, eos) for row in got.tolist()] == expected


def test_tokenizer_equals_marian_tokenizer(marian: dict) -> None:
    from runtime.files.tokenizer import load_tokenizer

    ours = load_tokenizer(marian["exported"])
    for text in TEXTS + ["Zounds! an unknown word: qzx"]:
        ids = marian["tokenizer"](text)["input_ids"]
        assert ours.encode(text) == ids
        assert ours.decode(ids) == marian["tokenizer"].decode(ids, skip_special_tokens=True)


def test_the_exports_tokenizer_json_gives_marian_tokenizers_ids(marian: dict) -> None:
    """tokenizer.json, written for transformers.js (which has no sentencepiece), splits text
    as MarianTokenizer does over the sentencepiece files: lines the pieces were not trained on,
    characters they never saw, spaces at either end and in runs, NFKC forms."""
    from tokenizers import Tokenizer

    ours = Tokenizer.from_file(str(marian["exported"] / "tokenizer.json"))
    lines = SHIPPED.read_text(encoding="utf-8").splitlines()[2000:2400]
    for text in [*lines, "café 東京 🙂", "  Speak,   speak.  ", "ＡＢＣ ﬁ", "x\u00a0y", ""]:
        ids = marian["tokenizer"](text)["input_ids"]
        assert ours.encode(text).ids == ids, repr(text)
        assert ours.decode(ids, skip_special_tokens=True) == marian["tokenizer"].decode(
            ids, skip_special_tokens=True), repr(text)


def cut_texts(marian: dict) -> list[list[int]]:
    """Target ids as a translation cut by max_new_tokens may end: on a bare "▁" piece (one, two),
    with it first or in the middle, with </s> or <unk> beside it, nothing; then random ones."""
    vocab = marian["tokenizer"].get_vocab()
    bare, eos, unk = vocab["\u2581"], vocab["</s>"], vocab["<unk>"]
    word, other = vocab["\u2581the"], vocab["s"]
    rng = np.random.default_rng(0)
    pieces = [rng.choice([bare, *range(len(vocab))], size=rng.integers(1, 9)).tolist()
              for _ in range(300)]
    return [[word, other, bare], [word, bare, bare], [bare, word], [bare, bare, word, other],
            [word, bare, other], [bare], [bare, bare], [bare, eos], [unk, bare, word, bare, eos],
            [], *pieces]


def test_the_exports_tokenizer_json_decodes_marian_tokenizers_text(marian: dict) -> None:
    """transformers.js decodes through tokenizer.json: the text must be MarianTokenizer's (and
    `zoo run`'s, which decodes with the sentencepiece files), spaces at either end cut."""
    from tokenizers import Tokenizer

    from runtime.files.tokenizer import load_tokenizer

    ours = Tokenizer.from_file(str(marian["exported"] / "tokenizer.json"))
    zoo_run = load_tokenizer(marian["exported"])
    for ids in cut_texts(marian):
        expected = marian["tokenizer"].decode(ids, skip_special_tokens=True)
        assert ours.decode(ids, skip_special_tokens=True) == expected, ids
        assert zoo_run.decode(ids) == expected, ids
    assert marian["tokenizer"].decode(cut_texts(marian)[1]) == "the"  # the case of issue 37


def test_node_and_transformers_js_decode_the_exports_tokenizer_json_the_same(
        marian: dict, tmp_path: Path) -> None:
    """The same ids through examples/web/tokenizer.mjs (@huggingface/tokenizers, in Node) and
    through transformers.js's AutoTokenizer: MarianTokenizer's text; and the zoo's Python
    tokenizer reading that tokenizer.json alone agrees (examples/node/tokenize.mjs's golden)."""
    from runtime.files.tokenizer import load_tokenizer
    from tests.support.js import (
        NODE_DIR,
        SCRIPT,
        node_problem,
        require,
        run_node,
        transformers_js_problem,
    )

    require(node_problem() or transformers_js_problem())
    ids = cut_texts(marian)[:40]
    expected = [marian["tokenizer"].decode(row, skip_special_tokens=True) for row in ids]
    alone = tmp_path / "alone"
    alone.mkdir()
    shutil.copyfile(marian["exported"] / "tokenizer.json", alone / "tokenizer.json")
    assert [load_tokenizer(alone).decode(row) for row in ids] == expected
    request = tmp_path / "request.json"
    request.write_text(json.dumps({"texts": [], "ids": ids}))
    node = run_node(NODE_DIR / "tokenize.mjs", str(alone), str(request))
    assert node.returncode == 0, node.stderr
    assert json.loads(node.stdout)["decoded"] == expected
    script = ("import { AutoTokenizer, env } from '@huggingface/transformers';"
              "const [root, name, ids] = process.argv.slice(1);"
              "env.allowRemoteModels = false; env.localModelPath = `${root}/`;"
              "const tokenizer = await AutoTokenizer.from_pretrained(name);"
              "console.log(JSON.stringify(JSON.parse(ids).map((row) => "
              "tokenizer.decode(row, { skip_special_tokens: true }))));")
    folder = marian["exported"].resolve()
    given = [row for row in ids if row]  # transformers.js throws on an empty list
    result = subprocess.run(["node", "--input-type=module", "-e", script, str(folder.parent),
                             folder.name, json.dumps(given)],
                            cwd=SCRIPT.parent, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout) == [text for row, text in zip(ids, expected, strict=True)
                                         if row]


def test_zoo_run_translates_text_with_beams(marian: dict) -> None:
    text = TEXTS[0]
    result = CliRunner().invoke(main, ["run", str(marian["exported"]), "--text", text,
                                       "--beams", "4", "--max-new-tokens", str(STEPS)])
    assert result.exit_code == 0, result.output
    encoded = marian["tokenizer"]([text], return_tensors="pt")
    with torch.no_grad():
        hf = marian["hf"].generate(**encoded, num_beams=4, do_sample=False,
                                   max_new_tokens=STEPS)
    assert result.output == marian["tokenizer"].decode(hf[0], skip_special_tokens=True) + "\n"


def test_a_folder_without_its_spm_files_is_one_line(marian: dict, tmp_path: Path) -> None:
    folder = tmp_path / "no-spm"
    shutil.copytree(marian["source"], folder)
    (folder / "source.spm").unlink()
    (folder / "target.spm").unlink()
    result = CliRunner().invoke(main, ["import", str(folder), "-o", str(tmp_path / "out")])
    assert result.exit_code == 2
    assert result.output.count("\n") == 1 and "no source.spm, target.spm" in result.output
    assert not (tmp_path / "out").exists()


def test_a_source_longer_than_max_positions_is_one_line(marian: dict) -> None:
    ids = ",".join(["5"] * 65)  # max_position_embeddings 64
    result = CliRunner().invoke(main, ["run", str(marian["exported"]), "--ids", ids])
    assert result.exit_code == 2
    assert result.output.count("\n") == 1
    assert "source of 65 tokens exceeds max_positions=64" in result.output


def test_separate_vocabularies_import_as_target_vocab_size(tmp_path: Path) -> None:
    """share_encoder_decoder_embeddings=false: a source and a target vocabulary of their own
    (target_vocab.json); the head is tied to the target embedding."""
    piece = train_spm(tmp_path, 120)
    vocab = marian_vocabulary(piece)
    inner = [p for p in vocab if p not in ("</s>", "<unk>", "<pad>")][::-1][:80]
    target_vocab = {p: i for i, p in enumerate(["</s>", "<unk>", *inner, "<pad>"])}
    pad = target_vocab["<pad>"]
    config = transformers.MarianConfig(
        vocab_size=len(vocab), decoder_vocab_size=len(target_vocab), d_model=32,
        encoder_layers=2, decoder_layers=2, encoder_attention_heads=4,
        decoder_attention_heads=4, encoder_ffn_dim=64, decoder_ffn_dim=64,
        max_position_embeddings=64, activation_function="swish", scale_embedding=True,
        pad_token_id=pad, decoder_start_token_id=pad, eos_token_id=0, forced_eos_token_id=None,
        share_encoder_decoder_embeddings=False, dropout=0.0, init_std=0.1)
    torch.manual_seed(1)
    model = transformers.MarianMTModel(config).eval()
    source = tmp_path / "opus-mt-separate"
    model.save_pretrained(source)
    for name in ("source.spm", "target.spm"):
        shutil.copyfile(piece, source / name)
    (source / "vocab.json").write_text(json.dumps(vocab), encoding="utf-8")
    (source / "target_vocab.json").write_text(json.dumps(target_vocab), encoding="utf-8")
    result = CliRunner().invoke(main, ["import", str(source), "-o", str(tmp_path / "built")])
    assert result.exit_code == 0, result.output
    zoo_model, card = load_built(tmp_path / "built")
    assert (card["vocab_size"], card["target_vocab_size"]) == (len(vocab), len(target_vocab))
    ids = torch.randint(2, len(vocab) - 1, (2, 9))
    target = torch.randint(1, pad, (2, 5))
    target[:, 0] = pad
    with torch.no_grad():
        expected = model(input_ids=ids, decoder_input_ids=target).logits.numpy()
        np.testing.assert_allclose(zoo_model(ids, target).numpy(), expected, atol=1e-4, rtol=0)
        hf = model.generate(input_ids=ids, do_sample=False, max_new_tokens=STEPS)
    got = generate(open_model(zoo_model, card), ids.numpy(), None, STEPS, eos=0)
    assert [until_eos(r, 0) for r in got.tolist()] == [until_eos(r[1:], 0) for r in hf.tolist()]
    from runtime.files.tokenizer import load_tokenizer

    theirs = transformers.MarianTokenizer(*(str(source / name) for name in (
        "source.spm", "target.spm", "vocab.json")), target_vocab_file=str(
        source / "target_vocab.json"), separate_vocabs=True)
    sample = list(range(2, 40)) + [0]
    assert load_tokenizer(tmp_path / "built").decode(sample) == theirs.decode(
        sample, skip_special_tokens=True)
