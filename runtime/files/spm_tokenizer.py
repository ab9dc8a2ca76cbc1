"""MarianMT's text in and out: sentencepiece pieces numbered by a vocabulary file.

`source.spm` splits the source text into pieces, `vocab.json` gives each piece its id (not the
sentencepiece model's own ids; an unknown piece is `<unk>`), and `</s>` ends the source, as
transformers' MarianTokenizer does. Target ids go back through `target_vocab.json` (or the shared
`vocab.json`) to pieces, and `target.spm` joins them into text, special tokens dropped.
A leading language code such as `>>fr<<` is one token of the vocabulary, as in MarianTokenizer.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from registry.errors import ZooError, needs_package
from registry.paths import display_path

SOURCE_SPM, TARGET_SPM = "source.spm", "target.spm"
VOCAB, TARGET_VOCAB = "vocab.json", "target_vocab.json"
SPM_FILES = (SOURCE_SPM, TARGET_SPM, VOCAB)  # required; TARGET_VOCAB only for separate vocabs
SPECIAL = ("</s>", "<unk>", "<pad>")


def processor(path: Path) -> Any:
    sentencepiece = needs_package("sentencepiece", display_path(path))
    try:
        return sentencepiece.SentencePieceProcessor(model_file=str(path))
    except (OSError, RuntimeError) as exc:
        raise ZooError(f"{display_path(path)}: not a sentencepiece model: {exc}") from exc


def vocabulary(path: Path) -> dict[str, int]:
    try:
        vocab = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError, RecursionError) as exc:  # JSON nested past the stack too
        raise ZooError(f"{display_path(path)}: not a readable vocabulary: {exc}") from exc
    if not isinstance(vocab, dict) or not all(isinstance(v, int) for v in vocab.values()):
        raise ZooError(f"{display_path(path)}: should map each piece to an integer id")
    for token in ("</s>", "<unk>"):
        if token not in vocab:
            raise ZooError(f"{display_path(path)}: has no {token} (MarianMT's vocabularies do)")
    return vocab


def missing_spm_files(folder: Path) -> list[str]:
    return [name for name in SPM_FILES if not (Path(folder) / name).is_file()]


class SentencePieceTokenizer:
    def __init__(self, folder: Path) -> None:
        folder = Path(folder)
        self.source = processor(folder / SOURCE_SPM)
        self.target = processor(folder / TARGET_SPM)
        self.vocab = vocabulary(folder / VOCAB)
        separate = folder / TARGET_VOCAB
        target_vocab = vocabulary(separate) if separate.is_file() else self.vocab
        self.pieces = {index: piece for piece, index in target_vocab.items()}
        self.special = {target_vocab[t] for t in SPECIAL if t in target_vocab}

    def encode(self, text: str) -> list[int]:
        code = []
        if text.startswith(">>") and (end := text.find("<<")) != -1:
            code, text = [text[: end + 2]], text[end + 2:]
        pieces = code + self.source.encode(text, out_type=str)
        unknown = self.vocab["<unk>"]
        return [self.vocab.get(piece, unknown) for piece in pieces] + [self.vocab["</s>"]]

    def decode(self, ids: list[int]) -> str:
        pieces = [self.pieces[i] for i in ids if i in self.pieces and i not in self.special]
        return self.target.decode_pieces(pieces).replace("\u2581", " ").strip()

    def label(self, token: int) -> str:
        return self.pieces.get(token, f"<{token}>")
