"""T5 folders as the Hugging Face hub has them (config.json, model.safetensors, spiece.model,
tokenizer.json), small enough for tests: transformers' T5ForConditionalGeneration (or mT5's)
with random tiny weights, and a tiny SentencePiece unigram model with T5's special ids (pad 0,
</s> 1, <unk> 2) and extra ids, trained here on the shipped text. tests/imports/test_t5.py imports
it."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

from tests.support.marian_folder import SHIPPED

PIECES, EXTRA_IDS, VOCAB = 100, 20, 128  # the model's vocabulary padded past the tokenizer's

# name: (transformers config class, its settings); each a layout the map reads differently
CONFIGS: dict[str, tuple[str, dict[str, Any]]] = {
    "t5": ("T5Config", {"feed_forward_proj": "relu"}),  # tied head, rescaled
    "t5-v1.1": ("T5Config", {"feed_forward_proj": "gated-gelu", "tie_word_embeddings": False}),
    "mt5": ("MT5Config", {"tie_word_embeddings": False}),  # MT5Config: gated-gelu by default
}


def train_spiece(folder: Path) -> Path:
    """T5's kind of SentencePiece model: unigram, pad 0, </s> 1, <unk> 2, no <s>."""
    import sentencepiece as spm

    lines = SHIPPED.read_text(encoding="utf-8").splitlines()[:2000]
    corpus = folder / "corpus.txt"
    corpus.write_text("\n".join(line for line in lines if line.strip()), encoding="utf-8")
    spm.SentencePieceTrainer.train(input=str(corpus), model_prefix=str(folder / "spiece"),
                                   vocab_size=PIECES, model_type="unigram", pad_id=0,
                                   eos_id=1, unk_id=2, bos_id=-1, character_coverage=1.0,
                                   minloglevel=2)
    return folder / "spiece.model"


def t5_folder(root: Path, kind: str = "t5", seed: int = 0) -> tuple[Path, Any, Any]:
    """(root/KIND: a T5 folder, its transformers model read back from it, its tokenizer)."""
    import torch
    import transformers

    root.mkdir(parents=True, exist_ok=True)
    piece = root / "spiece.model"
    if not piece.is_file():
        train_spiece(root)
    class_name, settings = CONFIGS[kind]
    config = getattr(transformers, class_name)(
        vocab_size=VOCAB, d_model=32, d_kv=8, d_ff=64, num_layers=2, num_heads=4,
        relative_attention_num_buckets=8, relative_attention_max_distance=20,
        dropout_rate=0.0, pad_token_id=0, eos_token_id=1, decoder_start_token_id=0,
        **settings)
    torch.manual_seed(seed)
    model_class = (transformers.MT5ForConditionalGeneration if kind == "mt5"
                   else transformers.T5ForConditionalGeneration)
    model = model_class(config).eval()
    with torch.no_grad():  # larger than T5's init, so the tiny model's tokens vary by source
        for parameter in model.parameters():
            parameter.normal_(0.0, 0.5)
        if not settings.get("tie_word_embeddings", True):
            model.lm_head.weight = torch.nn.Parameter(torch.randn(VOCAB, 32) * 0.5)
    source = root / kind
    model.save_pretrained(source)
    shutil.copyfile(piece, source / "spiece.model")  # read into tokenizer.json, with extra ids
    tokenizer = transformers.T5Tokenizer.from_pretrained(source, extra_ids=EXTRA_IDS)
    tokenizer.save_pretrained(source)
    if not settings.get("tie_word_embeddings", True):  # as the hub's files say it
        config_path = source / "config.json"
        written = json.loads(config_path.read_text(encoding="utf-8"))
        written["tie_word_embeddings"] = False
        config_path.write_text(json.dumps(written, indent=2), encoding="utf-8")
    model = model_class.from_pretrained(source).eval()
    return source, model, tokenizer
