"""Tokenizer files in the form the clients read: a Hugging Face `tokenizer.json`, with
`tokenizer_config.json` naming its class and `special_tokens_map.json` its special tokens
(transformers.js, transformers, Optimum and sentence-transformers read the three; ONNX Runtime
GenAI's tokenizer reads the first two).

The byte tokenizer (ids 0..255 are UTF-8 bytes) is exactly a byte-level BPE with no merges: GPT-2's
byte-to-character table maps each byte to one vocabulary entry whose id is the byte, so the zoo's
byte tokenizer and this file encode every text to the same ids (the special tokens' own strings
aside: a text that spells `<|eos|>` is one token here, five bytes there).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from export.targets.marian_tokenizer import (
    marian_special_tokens,
    marian_tokenizer_config,
    marian_tokenizer_json,
)
from registry.stems import is_mel_card
from runtime.files.spm_tokenizer import SOURCE_SPM, TARGET_VOCAB, VOCAB, vocabulary
from runtime.files.tokenizer import (
    BYTE_TOKENIZER,
    HF_TOKENIZER,
    ByteTokenizer,
    byte_to_unicode,
    load_tokenizer,
)

TOKENIZER_CONFIG = "tokenizer_config.json"
SPECIAL_TOKENS_MAP = "special_tokens_map.json"
BYTE_SPECIALS = {"pad": "<|pad|>", "bos": "<|bos|>", "eos": "<|eos|>", "mask": "<|mask|>"}


def byte_level_json(tokenizer: ByteTokenizer) -> str:
    """tokenizer.json for the byte tokenizer: byte-level BPE, no merges, specials at their ids."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

    specials = {BYTE_SPECIALS[role]: getattr(tokenizer, role) for role in BYTE_SPECIALS}
    vocab = {char: byte for byte, char in byte_to_unicode().items()} | specials
    backend = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    backend.add_special_tokens([AddedToken(name, special=True, normalized=False)
                                for name in sorted(specials, key=specials.get)])
    return backend.to_str(pretty=True)


def tokenizer_config(tokenizer_json: str, card: Any) -> dict[str, Any]:
    """tokenizer_config.json for `tokenizer_json`: GPT2Tokenizer for a byte-level BPE (the
    class GenAI's tokenizer reads it as), WhisperTokenizer for a speech model's, else the
    generic fast tokenizer, which every client builds from tokenizer.json alone; the card's
    special tokens by their strings."""
    spec = json.loads(tokenizer_json)
    byte_level = spec.get("model", {}).get("type") == "BPE" and _byte_level(spec)
    tokens = special_tokens(spec, card)
    kind = "GPT2Tokenizer" if byte_level else "PreTrainedTokenizerFast"
    if is_mel_card(card):  # the clients decode a transcript's timestamps with Whisper's class
        kind = "WhisperTokenizer"
    return {
        "tokenizer_class": kind,
        **({"add_prefix_space": False} if byte_level else {}),
        "clean_up_tokenization_spaces": False,
        "model_max_length": card["max_positions"],
        **{role: tokens.get(role) for role in ("bos_token", "eos_token", "pad_token")},
        **({"mask_token": tokens["mask_token"]} if "mask_token" in tokens else {}),
        "unk_token": None,
    }


def special_tokens(spec: dict[str, Any], card: Any) -> dict[str, str]:
    """{bos_token: its string, ...} for the card's special ids that the tokenizer has."""
    vocab = spec.get("model", {}).get("vocab")  # {token: id}; a Unigram's: [[token, score]]
    names = ({i: token for token, i in vocab.items()} if isinstance(vocab, dict)
             else {i: entry[0] for i, entry in enumerate(vocab or [])})
    names.update({entry["id"]: entry["content"] for entry in spec.get("added_tokens", [])})
    roles = {"bos_token": "bos_token_id", "eos_token": "eos_token_id", "pad_token": "pad_token_id",
             "mask_token": "mask_token_id"}
    return {role: names[card[field]] for role, field in roles.items()
            if card[field] is not None and card[field] in names}


def _byte_level(spec: dict[str, Any]) -> bool:
    pre = spec.get("pre_tokenizer") or {}
    parts = pre.get("pretokenizers", [pre]) if pre.get("type") == "Sequence" else [pre]
    return any(part.get("type") == "ByteLevel" for part in parts)


def _write_json(path: Path, content: Any) -> None:
    path.write_text(json.dumps(content, indent=2) + "\n", encoding="utf-8")


def write_marian_files(folder: Path, card: Any) -> tuple[list[str], list[str]]:
    """Beside MarianMT's sentencepiece files: tokenizer.json where one can say them
    (export/targets/marian_tokenizer.py), tokenizer_config.json naming MarianTokenizer,
    special_tokens_map.json; (the names written, the notes to show)."""
    text, note = marian_tokenizer_json(folder)
    written = []
    if text is not None:
        (folder / HF_TOKENIZER).write_text(text, encoding="utf-8")
        written.append(HF_TOKENIZER)
    vocab = vocabulary(folder / VOCAB)
    config = {**marian_tokenizer_config(card, vocab),
              "separate_vocabs": (folder / TARGET_VOCAB).is_file()}
    _write_json(folder / TOKENIZER_CONFIG, config)
    _write_json(folder / SPECIAL_TOKENS_MAP, marian_special_tokens(vocab))
    return [*written, TOKENIZER_CONFIG, SPECIAL_TOKENS_MAP], [note] if note else []


def write_tokenizer_files(folder: Path, card: Any) -> tuple[list[str], list[str]]:
    """Beside the export's own tokenizer file: tokenizer.json (the byte tokenizer's or
    MarianMT's sentencepiece files' translation), tokenizer_config.json and
    special_tokens_map.json; (the names written: none where the folder has no tokenizer the
    clients read, such as words; the notes to show)."""
    folder = Path(folder)
    if (folder / SOURCE_SPM).is_file() and not (folder / BYTE_TOKENIZER).is_file():
        return write_marian_files(folder, card)
    written = []
    if not (folder / HF_TOKENIZER).is_file() and (folder / BYTE_TOKENIZER).is_file():
        byte_tokenizer = load_tokenizer(folder)  # validated: a ByteTokenizer
        (folder / HF_TOKENIZER).write_text(byte_level_json(byte_tokenizer), encoding="utf-8")
        written.append(HF_TOKENIZER)
    if not (folder / HF_TOKENIZER).is_file():
        return written, []
    text = (folder / HF_TOKENIZER).read_text(encoding="utf-8")
    for name, content in ((TOKENIZER_CONFIG, tokenizer_config(text, card)),
                          (SPECIAL_TOKENS_MAP, special_tokens(json.loads(text), card))):
        _write_json(folder / name, content)
        written.append(name)
    return written, []
