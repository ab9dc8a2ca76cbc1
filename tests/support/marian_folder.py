"""A MarianMT folder as the Hugging Face hub has them (config.json, model.safetensors,
source.spm, target.spm, vocab.json), small enough for tests: transformers' MarianMTModel with
random tiny weights, and a tiny unigram sentencepiece model trained here on the shipped text.
tests/imports/test_marian.py imports it and checks it against transformers;
tests/support/hf_exports.py exports it for the Hugging Face clients."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

SHIPPED = Path(__file__).resolve().parents[2] / "zoo/training/datasets/tinyshakespeare.txt"


def train_spm(folder: Path, size: int) -> Path:
    """A tiny unigram sentencepiece model of the shipped text's first lines."""
    import sentencepiece as spm

    lines = SHIPPED.read_text(encoding="utf-8").splitlines()[:2000]
    corpus = folder / "corpus.txt"
    corpus.write_text("\n".join(line for line in lines if line.strip()), encoding="utf-8")
    spm.SentencePieceTrainer.train(input=str(corpus), model_prefix=str(folder / "piece"),
                                   vocab_size=size, model_type="unigram",
                                   character_coverage=1.0, minloglevel=2)
    return folder / "piece.model"


def marian_vocabulary(model: Path) -> dict[str, int]:
    """MarianMT's layout: </s> 0, <unk> 1, the pieces, <pad> last."""
    import sentencepiece as spm

    processor = spm.SentencePieceProcessor(model_file=str(model))
    pieces = [processor.id_to_piece(i) for i in range(processor.get_piece_size())
              if not (processor.is_control(i) or processor.is_unknown(i))]
    return {piece: index for index, piece in enumerate(["</s>", "<unk>", *pieces, "<pad>"])}


def marian_folder(root: Path, name: str = "opus-mt-tiny", seed: int = 0) -> tuple[Path, Any]:
    """(root/NAME: a MarianMT folder, its transformers model)."""
    import torch
    import transformers

    root.mkdir(parents=True, exist_ok=True)
    piece = train_spm(root, 120)
    vocab = marian_vocabulary(piece)
    pad = vocab["<pad>"]
    config = transformers.MarianConfig(
        vocab_size=len(vocab), d_model=32, encoder_layers=2, decoder_layers=2,
        encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=64,
        decoder_ffn_dim=64, max_position_embeddings=64, activation_function="swish",
        scale_embedding=False, pad_token_id=pad, decoder_start_token_id=pad, eos_token_id=0,
        forced_eos_token_id=None, dropout=0.0, init_std=0.1)
    torch.manual_seed(seed)
    model = transformers.MarianMTModel(config).eval()
    # Random where transformers starts at zero, so each part counts; init_std 0.1 and no
    # embedding scale, so a random tied model does not just repeat one token for every source.
    with torch.no_grad():
        model.final_logits_bias.normal_(0.0, 0.1)
        for parameter_name, parameter in model.named_parameters():
            if parameter_name.endswith("bias"):
                parameter.normal_(0.0, 0.1)
    source = root / name
    model.save_pretrained(source)
    for file in ("source.spm", "target.spm"):
        shutil.copyfile(piece, source / file)
    (source / "vocab.json").write_text(json.dumps(vocab), encoding="utf-8")
    return source, model
