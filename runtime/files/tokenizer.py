"""Text in and out: a byte-level tokenizer for models trained here (no files needed), a
Hugging Face `tokenizer.json` (through the `tokenizers` library) for imported checkpoints, and
MarianMT's sentencepiece files (runtime/files/spm_tokenizer.py).

A model folder (built, trained, imported or exported) holds at most one of:
- `byte-tokenizer.json`: {"kind": "bytes", "pad": 256, "bos": 257, "eos": 258, "mask": 259}
- `tokenizer.json`: a Hugging Face tokenizer.
- `source.spm`, `target.spm`, `vocab.json` (and `target_vocab.json`): MarianMT's.
- `word-tokenizer.json`: {"kind": "words", "words": [...]}: whole lowercase words from id 3
  (0-2: pad, bos, eos), for the word-reversal demo (zoo/training/reverse.py).
"""

from __future__ import annotations

import json
import re
from functools import cache
from pathlib import Path
from typing import Protocol

from registry.errors import ZooError
from registry.paths import display_path, inside
from runtime.files.chat import CHAT_TEMPLATE, check_chat_template
from runtime.files.spm_tokenizer import (
    SOURCE_SPM,
    SPM_FILES,
    TARGET_SPM,
    TARGET_VOCAB,
    VOCAB,
    SentencePieceTokenizer,
    processor,
    vocabulary,
)

BYTE_TOKENIZER = "byte-tokenizer.json"
HF_TOKENIZER = "tokenizer.json"
WORD_TOKENIZER = "word-tokenizer.json"
TOKENIZER_FILES = (BYTE_TOKENIZER, HF_TOKENIZER, WORD_TOKENIZER, *SPM_FILES, TARGET_VOCAB,
                   CHAT_TEMPLATE)


# a SentencePiece tokenizer.json's byte fallback piece (Llama 2's "<0xE6>") and word marker
BYTE_PIECE = re.compile(r"<0x([0-9A-Fa-f]{2})>")
WORD_MARK = "\u2581"


class Tokenizer(Protocol):
    def encode(self, text: str) -> list[int]: ...

    def decode(self, ids: list[int]) -> str: ...

    def label(self, token: int) -> str: ...


class ByteTokenizer:
    """UTF-8 bytes are ids 0..255; the special tokens follow."""

    def __init__(self, pad: int = 256, bos: int = 257, eos: int = 258, mask: int = 259) -> None:
        self.pad, self.bos, self.eos, self.mask = pad, bos, eos, mask

    @property
    def vocab_size(self) -> int:
        return max(self.pad, self.bos, self.eos, self.mask) + 1

    def encode(self, text: str) -> list[int]:
        return list(text.encode("utf-8"))

    def decode(self, ids: list[int]) -> str:
        return bytes(i for i in ids if i < 256).decode("utf-8", errors="replace")

    def label(self, token: int) -> str:
        """A readable label for one id: the character, a visible stand-in for whitespace, the
        byte in hex where it is part of a multi-byte character, the special token's name."""
        specials = {self.pad: "<pad>", self.bos: "<bos>", self.eos: "<eos>", self.mask: "<mask>"}
        if token in specials:
            return specials[token]
        if token >= 256:
            return f"<{token}>"
        visible = {32: "\u2423", 10: "\u21b5", 9: "\u21e5"}  # space, newline, tab
        if token in visible:
            return visible[token]
        return chr(token) if 33 <= token < 127 else f"\\x{token:02x}"

    def token_bytes(self, token: int) -> bytes:
        """The one byte a token is; a special token's name."""
        return bytes([token]) if token < 256 else self.label(token).encode()

    def to_json(self) -> str:
        return json.dumps({"kind": "bytes", "pad": self.pad, "bos": self.bos, "eos": self.eos,
                           "mask": self.mask}, indent=2) + "\n"


class WordTokenizer:
    """Whole lowercase words, ids from 3 in the order given; 0, 1, 2 are pad, bos, eos."""

    def __init__(self, words: list[str]) -> None:
        self.words = list(words)
        self.index = {word: i + 3 for i, word in enumerate(self.words)}

    def encode(self, text: str) -> list[int]:
        words = text.lower().split()
        unknown = [w for w in words if w not in self.index]
        if unknown:
            raise ZooError(f"words not in the vocabulary: {', '.join(unknown[:5])} (it has the "
                           f"{len(self.words)} most frequent words of its training text)")
        return [self.index[w] for w in words]

    def decode(self, ids: list[int]) -> str:
        return " ".join(self.words[i - 3] for i in ids if 3 <= i < len(self.words) + 3)

    def label(self, token: int) -> str:
        return self.words[token - 3] if 3 <= token < len(self.words) + 3 else f"<{token}>"

    def to_json(self) -> str:
        return json.dumps({"kind": "words", "words": self.words}) + "\n"


class HuggingFaceTokenizer:
    def __init__(self, path: Path) -> None:
        from tokenizers import Tokenizer as Backend

        try:
            self.backend = Backend.from_file(str(path))
        except Exception as exc:  # the library raises its own exception type
            raise ZooError(f"{display_path(path)}: not a readable tokenizer.json: {exc}") from exc
        # The zoo pads each batch itself (with the mask) and checks lengths against
        # max_positions: a tokenizer.json's own padding (all-MiniLM-L6-v2's pads every text to
        # 128 ids, all fed as real tokens) or truncation would change what a text means.
        self.backend.no_padding()
        self.backend.no_truncation()

    def encode(self, text: str) -> list[int]:
        return self.backend.encode(text, add_special_tokens=False).ids

    def decode(self, ids: list[int]) -> str:
        return self.backend.decode(list(ids), skip_special_tokens=True)

    def label(self, token: int) -> str:
        piece = self.backend.id_to_token(token)
        if piece is None:
            return f"<{token}>"
        # Byte-level BPE (GPT-2, Llama 3, SmolLM2) stores bytes as stand-in letters ("Ġcapital"
        # for " capital"): a whole token reads as its text, a piece of a character as stored.
        if type(self.backend.decoder).__name__ == "ByteLevel":
            text = self.backend.decode([token], skip_special_tokens=False)
            if text and "\ufffd" not in text:
                return text
        return piece

    def token_bytes(self, token: int) -> bytes:
        """The bytes one token stands for, exactly, even a piece of a character: byte-level
        BPE's stand-in letters mapped back through GPT-2's table, a byte-fallback piece's byte,
        SentencePiece's word marker as a space; an added token's own text."""
        added = self.backend.get_added_tokens_decoder()
        if token in added:
            return added[token].content.encode()
        piece = self.backend.id_to_token(token)
        if piece is None:
            return b""
        if type(self.backend.decoder).__name__ == "ByteLevel":
            table = unicode_to_byte()
            if all(char in table for char in piece):
                return bytes(table[char] for char in piece)
        if match := BYTE_PIECE.fullmatch(piece):
            return bytes([int(match.group(1), 16)])
        return piece.replace(WORD_MARK, " ").encode()


def byte_to_unicode() -> dict[int, str]:
    """GPT-2's table: printable bytes stand for themselves, the rest move past U+0100."""
    kept = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1),
            *range(ord("®"), ord("ÿ") + 1)]
    table, extra = {b: chr(b) for b in kept}, 0
    for b in range(256):
        if b not in table:
            table[b] = chr(256 + extra)
            extra += 1
    return table


@cache
def unicode_to_byte() -> dict[str, int]:
    return {char: byte for byte, char in byte_to_unicode().items()}


def sequence_ids(tokenizer: Tokenizer, text: str) -> list[int]:
    """A whole text's ids as a sequence model reads them (a sentence vector, a class): a
    tokenizer.json adds its special tokens (BERT's [CLS] ... [SEP], as transformers and
    sentence-transformers do); the byte and word tokenizers have none to add."""
    if isinstance(tokenizer, HuggingFaceTokenizer):
        return tokenizer.backend.encode(text, add_special_tokens=True).ids
    return tokenizer.encode(text)


def load_tokenizer(folder: Path) -> Tokenizer | None:
    """The tokenizer saved in `folder`, or None where there is none. The byte tokenizer and
    MarianMT's sentencepiece files win over a tokenizer.json beside them: an export's
    tokenizer.json is then their translation for the other clients (GenAI, transformers.js:
    export/targets/tokenizer_files.py)."""
    folder = Path(folder)
    for name in TOKENIZER_FILES:  # each read below (sentencepiece's too) stays in the folder
        inside(folder, name, display_path(folder), "tokenizer file")
    path = folder / BYTE_TOKENIZER
    if not path.is_file():
        if (folder / SPM_FILES[0]).is_file():
            return SentencePieceTokenizer(folder)
        if (folder / HF_TOKENIZER).is_file():
            return HuggingFaceTokenizer(folder / HF_TOKENIZER)
        if (folder / WORD_TOKENIZER).is_file():
            return _word_tokenizer(folder / WORD_TOKENIZER)
        return None
    return _byte_tokenizer(path)


def _byte_tokenizer(path: Path) -> ByteTokenizer:
    try:
        spec = json.loads(path.read_text(encoding="utf-8"))
        if spec.pop("kind") != "bytes":
            raise ValueError("kind should be 'bytes'")
        return ByteTokenizer(**spec)
    except (ValueError, KeyError, TypeError, AttributeError, RecursionError) as exc:
        raise ZooError(f"{display_path(path)}: not a byte tokenizer file: {exc}") from exc


def _word_tokenizer(path: Path) -> WordTokenizer:
    try:
        spec = json.loads(path.read_text(encoding="utf-8"))
        if spec.get("kind") != "words" or not all(isinstance(w, str) for w in spec["words"]):
            raise ValueError("expected kind 'words' and a list of words")
        return WordTokenizer(spec["words"])
    except (ValueError, KeyError, TypeError, AttributeError, RecursionError) as exc:
        raise ZooError(f"{display_path(path)}: not a word tokenizer file: {exc}") from exc


def check_tokenizer_file(path: Path) -> None:
    """Open one tokenizer file as what its name says it is, so a garbage file (or a system file
    under a tokenizer's name) is refused in one line before it is copied anywhere."""
    readers = {BYTE_TOKENIZER: _byte_tokenizer, HF_TOKENIZER: HuggingFaceTokenizer,
               WORD_TOKENIZER: _word_tokenizer, VOCAB: vocabulary, TARGET_VOCAB: vocabulary,
               SOURCE_SPM: processor, TARGET_SPM: processor, CHAT_TEMPLATE: check_chat_template}
    reader = readers.get(Path(path).name)
    if reader is None:
        raise ZooError(f"{display_path(path)}: not a tokenizer file the zoo reads "
                       f"({', '.join(TOKENIZER_FILES)})")
    reader(Path(path))


def tokenizer_files(folder: Path) -> list[Path]:
    """The tokenizer files of a model folder, each kept inside it and opened before it is
    copied into an export or a training run's folder."""
    folder = Path(folder)
    found = [inside(folder, name, display_path(folder), "tokenizer file")
             for name in TOKENIZER_FILES]
    found = [path for path in found if path.is_file()]
    for path in found:
        check_tokenizer_file(path)
    return found
