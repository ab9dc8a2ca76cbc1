"""Tokenizer files in the form ONNX Runtime GenAI's tokenizer reads: a Hugging Face
`tokenizer.json` with a `tokenizer_config.json` that names its class.

The byte tokenizer (ids 0..255 are UTF-8 bytes) is exactly a byte-level BPE with no merges: GPT-2's
byte-to-character table maps each byte to one vocabulary entry whose id is the byte, so the zoo's
byte tokenizer and this file encode every text to the same ids (the special tokens' own strings
aside: a text that spells `<|eos|>` is one token here, five bytes there).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from zoo.files.tokenizer import BYTE_TOKENIZER, HF_TOKENIZER, ByteTokenizer, load_tokenizer

TOKENIZER_CONFIG = "tokenizer_config.json"
BYTE_SPECIALS = {"pad": "<|pad|>", "bos": "<|bos|>", "eos": "<|eos|>", "mask": "<|mask|>"}


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


def tokenizer_config(tokenizer_json: str, card: Any) -> dict[str, Any] | None:
    """tokenizer_config.json naming the class GenAI should read `tokenizer_json` as; None for a
    model GenAI's tokenizer has no class for (only byte-level BPE is mapped here)."""
    spec = json.loads(tokenizer_json)
    if spec.get("model", {}).get("type") != "BPE" or not _byte_level(spec):
        return None
    names = {entry["id"]: entry["content"] for entry in spec.get("added_tokens", [])}
    names.update({i: token for token, i in spec["model"].get("vocab", {}).items()
                  if i in (card["bos_token_id"], card["eos_token_id"], card["pad_token_id"])})
    return {
        "tokenizer_class": "GPT2Tokenizer",
        "add_prefix_space": False,
        "clean_up_tokenization_spaces": False,
        "model_max_length": card["max_positions"],
        "bos_token": names.get(card["bos_token_id"]),
        "eos_token": names.get(card["eos_token_id"]),
        "pad_token": names.get(card["pad_token_id"]),
        "unk_token": None,
    }


def _byte_level(spec: dict[str, Any]) -> bool:
    pre = spec.get("pre_tokenizer") or {}
    parts = pre.get("pretokenizers", [pre]) if pre.get("type") == "Sequence" else [pre]
    return any(part.get("type") == "ByteLevel" for part in parts)


def write_genai_tokenizer(folder: Path, card: Any) -> list[str]:
    """Add what GenAI's tokenizer needs beside the export's own tokenizer file; the names of
    the files written (none when the folder has no tokenizer, or one GenAI cannot read)."""
    folder = Path(folder)
    written = []
    if not (folder / HF_TOKENIZER).is_file() and (folder / BYTE_TOKENIZER).is_file():
        byte_tokenizer = load_tokenizer(folder)  # validated: a ByteTokenizer
        (folder / HF_TOKENIZER).write_text(byte_level_json(byte_tokenizer), encoding="utf-8")
        written.append(HF_TOKENIZER)
    if not (folder / HF_TOKENIZER).is_file():
        return written
    config = tokenizer_config((folder / HF_TOKENIZER).read_text(encoding="utf-8"), card)
    if config is not None:
        (folder / TOKENIZER_CONFIG).write_text(json.dumps(config, indent=2) + "\n",
                                               encoding="utf-8")
        written.append(TOKENIZER_CONFIG)
    return written
