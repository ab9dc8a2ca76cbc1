"""Fresh exports of the tiny cards, made as a user makes them, for the tests that load them in
the Hugging Face clients (transformers.js, Optimum, sentence-transformers): `zoo build`, the
byte tokenizer a model trained here carries beside its weights, then `zoo export` of that
folder; and a translation model: `zoo import` of a tiny MarianMT folder
(tests/support/marian_folder.py, with its sentencepiece files), then `zoo export`; decoders: `zoo
import` of a random transformers Gemma 3 and Qwen3-MoE with a byte-level tokenizer.json
(tests/support/decoder_folders.py). Nothing is added to or edited in an export afterwards."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any
from unittest.mock import patch

from click.testing import CliRunner

from cli import main as zoo
from export.onnx import files, writer
from runtime.files.tokenizer import BYTE_TOKENIZER, ByteTokenizer
from tests.support.decoder_folders import FOLDERS, decoder_folder

# name: (card, --set overrides). The classifier reads a mean-pooled sentence vector (no
# transformers class computes that: its config names no architecture); the pooler classifier is
# BertForSequenceClassification itself.
MODELS = {
    "gpt": ("gpt-tiny", {}),
    "llama": ("llama-tiny", {}),
    "gemma": ("gemma-tiny", {}),  # local layers: a prompt of 23 bytes past its window of 16
    "embedder": ("bert-tiny", {"pooling": "mean", "normalize": True}),
    "classifier": ("bert-tiny", {"pooling": "mean", "num_labels": 3, "mlm_head": False,
                                 "labels": ["low", "mid", "high"]}),
    "pooler-classifier": ("bert-tiny", {"pooling": "pooler", "num_labels": 2,
                                        "mlm_head": False}),
    # ModernBERT (issue #35): a mean-pooled embedder that keeps its MLM head (config.json:
    # ModernBertForMaskedLM) and ModernBertForSequenceClassification (classifier_pooling mean)
    "modernbert-embedder": ("modernbert-tiny", {"pooling": "mean", "normalize": True}),
    "modernbert-classifier": ("modernbert-tiny", {"pooling": "mean", "num_labels": 3,
                                                  "mlm_head": False,
                                                  "labels": ["low", "mid", "high"]}),
}
TRANSLATOR = "translator"  # the MarianMT import
T5 = "t5"  # a T5 v1.1 (Flan-T5's) import: tests/support/t5_folder.py, tokenizer.json with extra ids
# `zoo import` of a random transformers Gemma 3 (window 4, every text past it) and Qwen3-MoE
# (tests/support/decoder_folders.py): a seeded gemma-tiny's greedy tokens barely vary, these do
IMPORTED_DECODERS = FOLDERS
# name: (a key of MODELS or TRANSLATOR, --quantize): the same built model exported quantized,
# its client graphs stored under the names transformers.js opens for the dtype (q4: model_q4,
# int8: model_int8, q8: model_quantized; the translator's encoder_model_int8 and
# decoder_model_merged_int8).
QUANTIZED = {
    "gpt-q4": ("gpt", "int4"),
    "gpt-int8": ("gpt", "int8"),
    "embedder-q8": ("embedder", "int8-dynamic"),
    "classifier-q8": ("classifier", "int8-dynamic"),
    "translator-int8": (TRANSLATOR, "int8"),
    "modernbert-classifier-q8": ("modernbert-classifier", "int8-dynamic"),
    "t5-int8": (T5, "int8"),
}
# name: (a key of MODELS or TRANSLATOR, --quantize or None): the same built model exported
# with --dtype fp16, stored as transformers.js's fp16 (model_fp16) or q4f16 (model_q4f16).
FLOAT16 = {
    "gpt-fp16": ("gpt", None),
    "gpt-q4f16": ("gpt", "int4"),
    "translator-fp16": (TRANSLATOR, None),
}
# gpt's export as a model past protobuf's 2 GB is written (the limits lowered for the test):
# traced with its weights on disk (export/onnx/weights.py), then onnx/model.onnx with its
# weights in onnx/model.onnx_data, config.json saying so.
EXTERNAL = "gpt-external"
KEYS = (*MODELS, TRANSLATOR, T5, *IMPORTED_DECODERS, *QUANTIZED, *FLOAT16, EXTERNAL)
TEXTS = ["ROMEO:", "café 東京 🙂", "Either you must confess"]
TRANSLATIONS = ["First Citizen: we are accounted poor citizens.", "Speak, speak."]


def built_model(root: Path, key: str, seed: int) -> Path:
    """root/KEY-built: `zoo build` of MODELS[key] with the byte tokenizer beside it, or the
    `zoo import` of the MarianMT folder (TRANSLATOR)."""
    built = root / f"{key}-built"
    if built.exists():
        return built
    if key == TRANSLATOR:
        return _imported_translator(root, built)
    if key == T5:
        return _imported_t5(root, built)
    if key in IMPORTED_DECODERS:
        return _imported(decoder_folder(root / "sources", key), built)
    name, overrides = MODELS[key]
    sets = [f"--set={field}={json.dumps(value)}" for field, value in overrides.items()]
    result = CliRunner().invoke(zoo, ["build", name, "-o", str(built), "--seed", str(seed),
                                      *sets])
    assert result.exit_code == 0, result.output
    (built / BYTE_TOKENIZER).write_text(ByteTokenizer().to_json(), encoding="utf-8")
    return built


def fresh_export(root: Path, key: str, seed: int = 1) -> Path:
    """root/KEY: the export of MODELS[key] (or the translator, or QUANTIZED[key], or
    FLOAT16[key]), made once per root."""
    out = root / key
    if out.exists():
        return out
    model, quantize = (QUANTIZED.get(key) or FLOAT16.get(key)
                       or (("gpt", None) if key == EXTERNAL else (key, None)))
    built = built_model(root, model, seed)
    limit = 1000 if key == EXTERNAL else files.PROTO_LIMIT  # bytes: every graph "too large"
    on_disk = 0 if key == EXTERNAL else writer.DISK_WEIGHTS_BYTES  # traced as a big model is
    with patch.object(files, "PROTO_LIMIT", limit), \
            patch.object(writer, "DISK_WEIGHTS_BYTES", on_disk):
        result = CliRunner().invoke(zoo, ["export", str(built), "--onnx", "-o", str(out),
                                          *(["--quantize", quantize] if quantize else []),
                                          *(["--dtype", "fp16"] if key in FLOAT16 else [])])
    assert result.exit_code == 0, result.output
    return out


def _imported(source: Path, built: Path) -> Path:
    """`zoo import SOURCE -o BUILT`."""
    result = CliRunner().invoke(zoo, ["import", str(source), "-o", str(built)])
    assert result.exit_code == 0, result.output
    return built


def _imported_translator(root: Path, built: Path) -> Path:
    from tests.support.marian_folder import marian_folder

    source, _ = marian_folder(root / "marian")
    return _imported(source, built)


def _imported_t5(root: Path, built: Path) -> Path:
    from tests.support.t5_folder import t5_folder

    source, _, _ = t5_folder(root / "t5-source", "t5-v1.1")
    return _imported(source, built)


def alone(run: Callable[[list[str]], Any]) -> list[Any]:
    """`run` on each of TEXTS by itself, as the tests hand the clients' pipelines one text at
    a time. With int8-dynamic that matters: each activation tensor gets one scale over its
    whole batch, so a row's vector depends on its batch-mates (bert-tiny's moved 1.6e-4 in a
    batch of three; alone, the zoo and transformers.js agreed within 1e-7)."""
    return [run([text]) for text in TEXTS]
