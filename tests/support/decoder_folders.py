"""Hugging Face decoder folders for the clients' tests (tests/support/hf_exports.py): a tiny random
Gemma3ForCausalLM (two sliding-window layers to one global, a window of 4, shorter than every
test text) and a Qwen3MoeForCausalLM (a dense layer, then two of top-2-of-4 experts), each
saved with save_pretrained beside a byte-level tokenizer.json (ids 0..255 are the UTF-8 bytes,
256..259 the special tokens), so the clients read the text as `zoo run` does. Their settings and
weights are those of tests/support/hf_decoders.py, with which tests/imports/ checks the imports
against transformers; the vocabulary here is the tokenizer's."""

from __future__ import annotations

from pathlib import Path

from export.targets.tokenizer_files import byte_level_json
from runtime.files.tokenizer import HF_TOKENIZER, ByteTokenizer
from tests.support import hf_decoders

WINDOW = 4  # below the shortest test text's 6 bytes: every prompt reaches past it
SPECIALS = dict(vocab_size=ByteTokenizer().vocab_size, pad_token_id=ByteTokenizer().pad,
                bos_token_id=ByteTokenizer().bos, eos_token_id=ByteTokenizer().eos)
GEMMA3, QWEN3_MOE = "gemma3-import", "qwen3-moe-import"
FOLDERS = (GEMMA3, QWEN3_MOE)


def decoder_folder(root: Path, name: str) -> Path:
    """root/NAME: the transformers folder of GEMMA3 or QWEN3_MOE."""
    import transformers

    if name == GEMMA3:
        kind, extra = hf_decoders.GEMMA_CASES["gemma3"]
        norm_mean = 0.0  # Gemma's norms: offsets from one
        config = transformers.Gemma3TextConfig(**{**hf_decoders.GEMMA_SIZES, **extra, **SPECIALS,
                                                  "sliding_window": WINDOW,
                                                  "tie_word_embeddings": False})
    else:
        kind, extra = hf_decoders.MOE_CASES["qwen3_moe"]
        norm_mean = 1.0
        config = transformers.Qwen3MoeConfig(**{**hf_decoders.MOE_SIZES, **extra, **SPECIALS})
    model = hf_decoders.randomise(getattr(transformers, f"{kind}ForCausalLM")(config),
                                  norm_mean=norm_mean)
    folder = root / name
    model.save_pretrained(folder)
    (folder / HF_TOKENIZER).write_text(byte_level_json(ByteTokenizer()), encoding="utf-8")
    return folder
