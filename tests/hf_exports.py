"""Fresh exports of the tiny cards, made as a user makes them, for the tests that load them in
the Hugging Face clients (transformers.js, Optimum, sentence-transformers): `zoo build`, the
byte tokenizer a model trained here carries beside its weights, then `zoo export` of that
folder; and a translation model: `zoo import` of a tiny MarianMT folder (tests/marian_folder.py,
with its sentencepiece files), then `zoo export`. Nothing is added to or edited in an export
afterwards."""

from __future__ import annotations

import json
from pathlib import Path

from click.testing import CliRunner

from cli import main as zoo
from zoo.files.tokenizer import BYTE_TOKENIZER, ByteTokenizer

# name: (card, --set overrides). The classifier reads a mean-pooled sentence vector (no
# transformers class computes that: its config names no architecture); the pooler classifier is
# BertForSequenceClassification itself.
MODELS = {
    "gpt": ("gpt-tiny", {}),
    "llama": ("llama-tiny", {}),
    "embedder": ("bert-tiny", {"pooling": "mean", "normalize": True}),
    "classifier": ("bert-tiny", {"pooling": "mean", "num_labels": 3, "mlm_head": False,
                                 "labels": ["low", "mid", "high"]}),
    "pooler-classifier": ("bert-tiny", {"pooling": "pooler", "num_labels": 2,
                                        "mlm_head": False}),
}
TRANSLATOR = "translator"  # the MarianMT import
KEYS = (*MODELS, TRANSLATOR)
TEXTS = ["ROMEO:", "café 東京 🙂", "Either you must confess"]
TRANSLATIONS = ["First Citizen: we are accounted poor citizens.", "Speak, speak."]


def fresh_export(root: Path, key: str, seed: int = 1) -> Path:
    """root/KEY: the export of MODELS[key] (or of the MarianMT import), made once per root."""
    out = root / key
    if out.exists():
        return out
    if key == TRANSLATOR:
        return _translator(root, out)
    name, overrides = MODELS[key]
    built = root / f"{key}-built"
    sets = [f"--set={field}={json.dumps(value)}" for field, value in overrides.items()]
    for args in (["build", name, "-o", str(built), "--seed", str(seed), *sets],
                 ["export", str(built), "--onnx", "-o", str(out)]):
        if args[0] == "export":
            (built / BYTE_TOKENIZER).write_text(ByteTokenizer().to_json(), encoding="utf-8")
        result = CliRunner().invoke(zoo, args)
        assert result.exit_code == 0, result.output
    return out


def _translator(root: Path, out: Path) -> Path:
    from tests.marian_folder import marian_folder

    source, _ = marian_folder(root / "marian")
    built = root / "translator-built"
    for args in (["import", str(source), "-o", str(built)],
                 ["export", str(built), "--onnx", "-o", str(out)]):
        result = CliRunner().invoke(zoo, args)
        assert result.exit_code == 0, result.output
    return out
