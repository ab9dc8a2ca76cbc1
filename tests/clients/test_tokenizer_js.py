"""One tokenizer, the same ids everywhere: for a fixed set of texts, the ids and the decoded
text from Node.js (examples/node/tokenize.mjs) and from the page in headless Chromium
(examples/web/check-page.mjs --golden) equal the zoo's Python tokenizer's (zoo/files/
tokenizer.py, which reads tokenizer.json with Python `tokenizers`), for the byte tokenizer, a
GPT-2-style byte-level BPE tokenizer.json and a BERT-style WordPiece one, both trained here with
`tokenizers` on the shipped text, and a Llama 2 style SentencePiece BPE as a GGUF import converts
it; with and without the special tokens a whole sequence gets (`sequence`). Skips (or fails
under ZOO_REQUIRE_NODE_WEB=1) as tests/clients/test_node_web.py does.

Not compared: SentencePiece byte pieces of a character cut short. Python's `tokenizers` (and
SentencePiece itself) decode each of its bytes to a U+FFFD, @huggingface/tokenizers the cut
sequence to one (as TextDecoder does); a byte that is never UTF-8 is one U+FFFD in both."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from tokenizers import (
    Tokenizer,
    decoders,
    models,
    normalizers,
    pre_tokenizers,
    processors,
    trainers,
)

from runtime.files.tokenizer import (
    BYTE_TOKENIZER,
    HF_TOKENIZER,
    ByteTokenizer,
    load_tokenizer,
    sequence_ids,
)
from tests.support.js import (
    NODE_DIR,
    WEB_DIR,
    browser_problem,
    node_problem,
    require,
    run_node,
    serving,
)
from zoo.training.data import SHIPPED_TEXT

TEXTS = [
    "", "Hello, world!", "ROMEO: What, ho! Who's there?", "don't stop-the 3.14 x2",
    "café déjà vu, naïve Ünïcödé ÅÉÎ",  # accents, composed
    "cafe\u0301 n\u0303",  # combining accents
    "東京 北京 你好世界", "こんにちは、世界", "한국어",  # CJK
    "emoji 🙂👍🏽 family 👨‍👩‍👧 flag 🇫🇷",  # astral, skin tone, ZWJ, regional indicators
    "a  b   c\t\td\n\n e  ", "   leading", "trailing   ", "\n", " ", "\t\r\n",  # whitespace
    "<|endoftext|> [CLS] [MASK] <eos>",  # special tokens' names, as text
]
SPECIALS_GPT = ["<|endoftext|>"]
SPECIALS_BERT = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
# Id lists to decode: special tokens (skipped), and for bytes UTF-8 that breaks off or is
# invalid (each bad sequence one U+FFFD, as Python's errors="replace" does).
DECODE = {
    "bytes": [[72, 105, 258, 33], [0xE6, 0x9D, 0xB1, 0x41], [0xE6, 0x9D], [0xFF, 0x41, 0xC0, 0xAF],
              [0xF0, 0x9F, 0x99], [0xED, 0xA0, 0x80, 0x41], [256, 257, 259]],
    "gpt2": [[0, 40, 41, 42], [300, 301, 0]],
    # <s> pieces </s>; the byte pieces (ids 3 + byte) of 東; a byte that is never UTF-8
    "spm": [[1, 300, 301, 2], [3 + 0xE6, 3 + 0x9D, 3 + 0xB1, 300], [300, 3 + 0xFF, 301]],
    "bert": [[2, 40, 41, 3], [4, 100, 101, 1]],
}


def byte_level_bpe(text: str) -> Tokenizer:
    """GPT-2's layout: byte-level pre-tokenizer and decoder, BPE, one special token."""
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.train_from_iterator([text], trainers.BpeTrainer(
        vocab_size=600, special_tokens=SPECIALS_GPT,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    return tokenizer


def wordpiece(text: str) -> Tokenizer:
    """BERT's layout: its normalizer (lowercase, accents stripped, CJK split), pre-tokenizer,
    WordPiece with [UNK], the [CLS] ... [SEP] template and the WordPiece decoder."""
    tokenizer = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    tokenizer.normalizer = normalizers.BertNormalizer(lowercase=True)
    tokenizer.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tokenizer.decoder = decoders.WordPiece()
    tokenizer.train_from_iterator([text], trainers.WordPieceTrainer(
        vocab_size=600, special_tokens=SPECIALS_BERT))
    tokenizer.post_processor = processors.BertProcessing(("[SEP]", 3), ("[CLS]", 2))
    return tokenizer


@pytest.fixture(scope="module")
def folders(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A folder per tokenizer, holding only its file; `both`: a byte tokenizer beside a
    tokenizer.json that is not its translation (the byte tokenizer must win, as in Python)."""
    root = tmp_path_factory.mktemp("tokenizers")
    text = SHIPPED_TEXT.read_text(encoding="utf-8")[:100_000]
    made = {name: root / name for name in ("bytes", "gpt2", "bert", "both")}
    for folder in made.values():
        folder.mkdir()
    for name in ("bytes", "both"):
        (made[name] / BYTE_TOKENIZER).write_text(ByteTokenizer().to_json())
    byte_level_bpe(text).save(str(made["gpt2"] / HF_TOKENIZER))
    byte_level_bpe(text).save(str(made["both"] / HF_TOKENIZER))
    wordpiece(text).save(str(made["bert"] / HF_TOKENIZER))
    made["spm"] = root / "spm"
    made["spm"].mkdir()
    (made["spm"] / HF_TOKENIZER).write_text(sentencepiece_from_gguf(), encoding="utf-8")
    return made


def sentencepiece_from_gguf() -> str:
    """Llama 2's kind: a SentencePiece BPE trained here, as `zoo import` converts it from a GGUF
    file's pieces, scores and types (zoo/files/gguf_tokenizer.py; BOS added to a sequence)."""
    from tests.support.gguf_files import sentencepiece_bpe, spm_fields
    from zoo.files.gguf_tokenizer import gguf_tokenizer

    converted = gguf_tokenizer(spm_fields(sentencepiece_bpe(600)))
    assert converted is not None
    return converted


def python_golden(folder: Path, ids: list[list[int]]) -> dict:
    """What the zoo's Python tokenizer gives (`zoo run --text` encodes and decodes with it)."""
    tokenizer = load_tokenizer(folder)
    encoded = [tokenizer.encode(text) for text in TEXTS]
    return {"encoded": [{"ids": row, "text": tokenizer.decode(row),
                         "sequence": sequence_ids(tokenizer, text)}
                        for row, text in zip(encoded, TEXTS, strict=True)],
            "decoded": [tokenizer.decode(row) for row in ids]}


CASES = [("bytes", "bytes", "bytes"), ("gpt2", "tokenizer.json", "gpt2"),
         ("bert", "tokenizer.json", "bert"), ("both", "bytes", "bytes"),
         ("spm", "tokenizer.json", "spm")]


def assert_same(answer: dict, expected: dict, kind: str) -> None:
    assert answer["kind"] == kind
    for text, got, want in zip(TEXTS, answer["encoded"], expected["encoded"], strict=True):
        assert got == want, f"{text!r}: {got} != {want}"
    assert answer["decoded"] == expected["decoded"]


def test_python_tokenizers_are_the_reference_they_should_be(folders: dict[str, Path]) -> None:
    """The reference itself: the byte tokenizer's ids are the UTF-8 bytes, byte-level BPE gives
    back every text exactly, BERT's WordPiece the lowercased text without accents; neither
    adds special tokens when encoding."""
    for name in ("bytes", "both"):
        assert [load_tokenizer(folders[name]).encode(t) for t in TEXTS] == [
            list(t.encode("utf-8")) for t in TEXTS]
    gpt2, bert = load_tokenizer(folders["gpt2"]), load_tokenizer(folders["bert"])
    plain = [text for text in TEXTS if "<|endoftext|>" not in text]  # decoding skips specials
    assert [gpt2.decode(gpt2.encode(text)) for text in plain] == plain
    assert bert.decode(bert.encode("Café DÉJÀ vu")) == "cafe deja vu"
    assert 2 not in bert.encode("hello") and gpt2.encode("") == []  # 2: [CLS]
    assert len(gpt2.encode(TEXTS[2])) < len(TEXTS[2].encode())  # merges, not only bytes


def node_golden(folder: Path, request: Path) -> dict:
    result = run_node(NODE_DIR / "tokenize.mjs", str(folder), str(request))
    assert result.returncode == 0 and result.stderr == "", result.stderr
    return json.loads(result.stdout)


@pytest.mark.parametrize("name, kind, decode", CASES)
def test_node_tokenizer_gives_python_ids_and_text(name: str, kind: str, decode: str,
                                                  folders: dict[str, Path],
                                                  tmp_path: Path) -> None:
    require(node_problem())
    request = tmp_path / "request.json"
    request.write_text(json.dumps({"texts": TEXTS, "ids": DECODE[decode]}))
    assert_same(node_golden(folders[name], request),
                python_golden(folders[name], DECODE[decode]), kind)


def test_node_tokenizer_errors_are_one_line(folders: dict[str, Path], tmp_path: Path) -> None:
    require(node_problem())
    request = tmp_path / "request.json"
    request.write_text(json.dumps({"texts": ["x"]}))
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / HF_TOKENIZER).write_text("{not json")
    for folder, message in [(tmp_path, "no tokenizer"), (broken, "tokenizer.json: not valid JSON")]:
        result = run_node(NODE_DIR / "tokenize.mjs", str(folder), str(request))
        assert result.returncode == 2 and result.stdout == ""
        assert len(result.stderr.splitlines()) == 1 and message in result.stderr, result.stderr


STREAM = "café 東京 🙂 👨‍👩‍👧 naïve"
STREAM_SCRIPT = """
import { readTokenizer, textStream } from './text.mjs';
const [folder, ids] = [process.argv[1], JSON.parse(process.argv[2])];
const stream = textStream(await readTokenizer(folder));
const pieces = ids.map((id) => stream.push(id));
console.log(JSON.stringify([...pieces, stream.end()]));
"""


@pytest.mark.parametrize("name", ["bytes", "gpt2"])
def test_streamed_text_joins_to_pythons_decoding(name: str, folders: dict[str, Path]) -> None:
    """Text printed token by token (examples/web/tokenizer.mjs's textStream, used by
    generate.mjs and the page) joins to Python's decoding of all the ids, and no piece shows
    half a character: the ids of multi-byte characters come one token at a time, and for bytes
    also a broken sequence (an invalid byte, a character cut short at the end)."""
    require(node_problem())
    tokenizer = load_tokenizer(folders[name])
    ids = tokenizer.encode(STREAM) + ([0xE6, 0x9D, 0x41, 0xF0, 0x9F] if name == "bytes" else [])
    done = subprocess.run(["node", "--input-type=module", "-e", STREAM_SCRIPT,
                           str(folders[name]), json.dumps(ids)], cwd=NODE_DIR,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    pieces = json.loads(done.stdout)
    assert "".join(pieces) == tokenizer.decode(ids)
    assert len([piece for piece in pieces if piece]) > 5  # it streamed, not all at the end
    assert all("\ufffd" not in piece for piece in pieces[:len(tokenizer.encode(STREAM))])


@pytest.fixture(scope="module")
def server(folders: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    require(browser_problem())
    root = tmp_path_factory.mktemp("tokenizer-web")
    (root / "web").symlink_to(WEB_DIR)
    for name, folder in folders.items():
        (root / name).symlink_to(folder)
    with serving(root) as url:
        yield url


def test_page_tokenizer_gives_python_ids_and_text(server: str, folders: dict[str, Path],
                                                  tmp_path: Path) -> None:
    """All four folders in one Chromium (a launch takes seconds on 2 cores), a tab each."""
    args = []
    for name, _, decode in CASES:
        request = tmp_path / f"{name}.json"
        request.write_text(json.dumps({"texts": TEXTS, "ids": DECODE[decode]}))
        args += [f"{server}web/index.html?model=../{name}/", "--golden", str(request)]
    profile = tmp_path / "profile"
    profile.mkdir()
    result = run_node(WEB_DIR / "check-page.mjs", *args, "--user-data-dir", str(profile),
                      timeout=20 + 40 * len(CASES))
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert len(lines) == len(CASES), result.stdout
    for line, (name, kind, decode) in zip(lines, CASES, strict=True):
        assert_same(json.loads(line), python_golden(folders[name], DECODE[decode]), kind)
