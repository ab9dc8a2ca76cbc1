"""Importing sentence-transformers folders and BertForSequenceClassification folders (issue
#11): tiny random models made here with transformers, the reference computed here (the pooling
formulas written out; transformers' own logits), compared through PyTorch and ONNX Runtime."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from export.opening import open_export
from tests.support.helpers import assert_one_line_error, zoo, zoo_ok
from zoo.files.weights import load_built

transformers = pytest.importorskip("transformers")

TOLERANCE = 1e-5
IDS = torch.tensor([[2, 15, 33, 47, 8, 91, 3], [2, 60, 12, 3, 0, 0, 0]])
MASK = torch.tensor([[1, 1, 1, 1, 1, 1, 1], [1, 1, 1, 1, 0, 0, 0]])
TYPES = torch.tensor([[0, 0, 0, 1, 1, 1, 1], [0, 0, 1, 1, 0, 0, 0]])


def tiny_config(**extra: object) -> object:
    return transformers.BertConfig(vocab_size=99, hidden_size=32, num_hidden_layers=2,
                                   num_attention_heads=4, intermediate_size=37,
                                   max_position_embeddings=64, type_vocab_size=2, **extra)


def sentence_folder(folder: Path, pooling: str, normalize: bool) -> np.ndarray:
    """A sentence-transformers folder (BertModel + Pooling [+ Normalize]); returns the
    reference sentence vectors for IDS/MASK/TYPES."""
    torch.manual_seed(0)
    model = transformers.BertModel(tiny_config()).eval()
    model.save_pretrained(folder, safe_serialization=True)
    modules = [{"idx": 0, "name": "0", "path": "",
                "type": "sentence_transformers.models.Transformer"},
               {"idx": 1, "name": "1", "path": "1_Pooling",
                "type": "sentence_transformers.models.Pooling"}]
    if normalize:
        modules.append({"idx": 2, "name": "2", "path": "2_Normalize",
                        "type": "sentence_transformers.models.Normalize"})
        (folder / "2_Normalize").mkdir()
    (folder / "modules.json").write_text(json.dumps(modules))
    (folder / "1_Pooling").mkdir()
    (folder / "1_Pooling" / "config.json").write_text(json.dumps({
        "word_embedding_dimension": 32, "pooling_mode_cls_token": pooling == "cls",
        "pooling_mode_mean_tokens": pooling == "mean", "pooling_mode_max_tokens": False,
        "pooling_mode_mean_sqrt_len_tokens": False}))
    with torch.no_grad():
        hidden = model(input_ids=IDS, attention_mask=MASK,
                       token_type_ids=TYPES).last_hidden_state.double()
    if pooling == "mean":  # sentence-transformers: sum(h * m) / clamp(sum(m), 1e-9)
        weights = MASK.double().unsqueeze(-1)
        vectors = (hidden * weights).sum(1) / weights.sum(1).clamp(min=1e-9)
    else:
        vectors = hidden[:, 0]
    if normalize:
        vectors = vectors / vectors.norm(dim=1, keepdim=True).clamp(min=1e-12)
    return vectors.numpy()


def feeds() -> dict[str, np.ndarray]:
    return {"input_ids": IDS.numpy(), "attention_mask": MASK.numpy(),
            "token_type_ids": TYPES.numpy()}


def through_torch(folder: Path) -> dict[str, np.ndarray]:
    model, _ = load_built(folder)
    with torch.no_grad():
        out = model(IDS, MASK, TYPES)
    return {name: value.numpy() for name, value in out.items()}


@pytest.mark.parametrize(("pooling", "normalize"), [("mean", True), ("cls", False)])
def test_sentence_transformers_folder_through_pytorch(tmp_path: Path, pooling: str,
                                                      normalize: bool) -> None:
    expected = sentence_folder(tmp_path / "st", pooling, normalize)
    zoo_ok("import", str(tmp_path / "st"), "-o", str(tmp_path / "zoo"))
    config = (tmp_path / "zoo" / "config.yaml").read_text()
    assert f"pooling: {pooling}" in config and f"normalize: {str(normalize).lower()}" in config
    got = through_torch(tmp_path / "zoo")["sentence_embedding"]
    np.testing.assert_allclose(got, expected, atol=TOLERANCE, rtol=0)


def test_sentence_transformers_folder_through_onnx_runtime(tmp_path: Path) -> None:
    expected = sentence_folder(tmp_path / "st", "mean", True)
    zoo_ok("import", str(tmp_path / "st"), "-o", str(tmp_path / "zoo"))
    zoo_ok("export", str(tmp_path / "zoo"), "--onnx", "-o", str(tmp_path / "onnx"))
    runtime = open_export(tmp_path / "onnx", "cpu")
    got = runtime.run("onnx/model.onnx", feeds())["sentence_embedding"]
    np.testing.assert_allclose(got, expected, atol=TOLERANCE, rtol=0)
    record = json.loads((tmp_path / "zoo" / "source.json").read_text())
    assert record["sentence_transformers"]["pooling"] == "mean"


def test_unsupported_sentence_module_is_one_line(tmp_path: Path) -> None:
    sentence_folder(tmp_path / "st", "mean", False)
    modules = json.loads((tmp_path / "st" / "modules.json").read_text())
    modules.append({"idx": 2, "name": "2", "path": "2_Dense",
                    "type": "sentence_transformers.models.Dense"})
    (tmp_path / "st" / "modules.json").write_text(json.dumps(modules))
    assert_one_line_error(zoo("import", tmp_path / "st", "-o", tmp_path / "zoo"),
                          "modules.json: module 'sentence_transformers.models.Dense'")
    assert not (tmp_path / "zoo").exists()


def classifier_folder(folder: Path) -> np.ndarray:
    """A BertForSequenceClassification folder; returns transformers' logits for the feeds."""
    torch.manual_seed(1)
    config = tiny_config(id2label={0: "neg", 1: "pos", 2: "mixed"},
                         label2id={"neg": 0, "pos": 1, "mixed": 2})
    model = transformers.BertForSequenceClassification(config).eval()
    model.save_pretrained(folder, safe_serialization=True)
    with torch.no_grad():
        return model(input_ids=IDS, attention_mask=MASK, token_type_ids=TYPES).logits.numpy()


def test_sequence_classification_folder_through_pytorch_and_onnx(tmp_path: Path) -> None:
    expected = classifier_folder(tmp_path / "hf")
    output = zoo_ok("import", str(tmp_path / "hf"), "-o", str(tmp_path / "zoo"))
    assert "BertForSequenceClassification" in output
    _, imported = load_built(tmp_path / "zoo")
    assert imported["labels"] == ["neg", "pos", "mixed"]
    assert (imported["pooling"], imported["num_labels"]) == ("pooler", 3)
    np.testing.assert_allclose(through_torch(tmp_path / "zoo")["logits"], expected,
                               atol=TOLERANCE, rtol=0)
    zoo_ok("export", str(tmp_path / "zoo"), "--onnx", "-o", str(tmp_path / "onnx"))
    got = open_export(tmp_path / "onnx", "cpu").run("onnx/model.onnx", feeds())["logits"]
    np.testing.assert_allclose(got, expected, atol=TOLERANCE, rtol=0)
