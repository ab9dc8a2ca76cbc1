"""Hugging Face decoder folders for the clients' tests (tests/support/hf_exports.py): a tiny random
Gemma3ForCausalLM (two sliding-window layers to one global, a window of 4, shorter than every
test text) and a Qwen3MoeForCausalLM (a dense layer, then two of top-2-of-4 experts), each
saved with save_pretrained beside a byte-level tokenizer.json (ids 0..255 are the UTF-8 bytes,
256..259 the special tokens), so the clients read the text as `zoo run` does. Their settings and
weights are those of tests/support/hf_decoders.py's rows, with which
tests/imports/test_hf_decoders.py checks the imports against transformers; the vocabulary here
is the tokenizer's. `llama_folder`: the `llama` row's model over the same tokenizer, with the
tokenizer_config.json AutoTokenizer reads its special tokens from, for `zoo serve`'s
log-probabilities and lm-evaluation-harness (tests/serve/test_serve_logprobs.py)."""

from __future__ import annotations

import json
from pathlib import Path

from export.targets.tokenizer_files import TOKENIZER_CONFIG, byte_level_json, tokenizer_config
from runtime.files.tokenizer import HF_TOKENIZER, ByteTokenizer
from tests.support import hf_decoders

WINDOW = 4  # below the shortest test text's 6 bytes: every prompt reaches past it
SPECIALS = dict(vocab_size=ByteTokenizer().vocab_size, pad_token_id=ByteTokenizer().pad,
                bos_token_id=ByteTokenizer().bos, eos_token_id=ByteTokenizer().eos)
GEMMA3, QWEN3_MOE = "gemma3-import", "qwen3-moe-import"
FOLDERS = (GEMMA3, QWEN3_MOE)


def decoder_folder(root: Path, name: str) -> Path:
    """root/NAME: the transformers folder of GEMMA3 or QWEN3_MOE."""
    row = hf_decoders.DECODERS["gemma3" if name == GEMMA3 else "qwen3_moe"]
    changes = ({"sliding_window": WINDOW, "tie_word_embeddings": False} if name == GEMMA3
               else {})
    model = row.reference(**SPECIALS, **changes)
    folder = root / name
    model.save_pretrained(folder)
    (folder / HF_TOKENIZER).write_text(byte_level_json(ByteTokenizer()), encoding="utf-8")
    return folder


def llama_folder(root: Path, max_positions: int = 64) -> Path:
    """root/llama: the `llama` row's random LlamaForCausalLM (seeded) saved with
    save_pretrained beside the byte-level tokenizer.json and its tokenizer_config.json."""
    model = hf_decoders.DECODERS["llama"].reference(**SPECIALS,
                                                   max_position_embeddings=max_positions)
    folder = root / "llama"
    model.save_pretrained(folder)
    text = byte_level_json(ByteTokenizer())
    (folder / HF_TOKENIZER).write_text(text, encoding="utf-8")
    card = {"max_positions": max_positions, "mask_token_id": None,
            **{f"{role}_token_id": SPECIALS[f"{role}_token_id"] for role in ("bos", "eos", "pad")}}
    (folder / TOKENIZER_CONFIG).write_text(json.dumps(tokenizer_config(text, card)),
                                           encoding="utf-8")
    return folder
