"""`zoo train vit-tiny --task classify`: an image model trained on scikit-learn's 8x8 digits,
preprocessed as `zoo run --image` preprocesses files. The quick test checks what a run writes;
the slow one trains to a held-out accuracy (README's figure) with a margin, and its export
classifies a digit drawn to a PNG file as the trained model does."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from tests.support.helpers import assert_one_line_error, zoo, zoo_ok

pytest.importorskip("sklearn")
Image = pytest.importorskip("PIL.Image")

STEPS = 400
ACCURACY = 0.85  # measured 0.928 on the 359 held-out images (README); the margin covers seeds


def test_a_short_run_writes_its_scores_and_preprocessing(tmp_path: Path) -> None:
    out = tmp_path / "vit"
    zoo_ok("train", "vit-tiny", "--task", "classify", "--steps", "2", "--batch-size", "4",
           "--checkpoint-every", "2", "-o", out)
    scores = json.loads((out / "eval.json").read_text())
    assert scores["examples"] == 359  # a fifth of the 1,797 digits held out
    # the majority baseline of a 10-class set with about 180 of each: about one in ten
    assert 0.05 < scores["majority_baseline"]["accuracy"] < 0.15
    processor = json.loads((out / "preprocessor_config.json").read_text())
    assert processor["size"] == {"height": 32, "width": 32}
    card = (out / "config.yaml").read_text()
    assert "labels:" in card and "num_labels: 10" in card


def test_text_data_for_an_image_model_is_refused(tmp_path: Path) -> None:
    rows = tmp_path / "rows.jsonl"
    rows.write_text('{"text": "a", "label": "x"}\n')
    result = zoo("train", "vit-tiny", "--task", "classify", "--data", rows, "-o", tmp_path / "o")
    assert_one_line_error(result, "--data")
    assert not (tmp_path / "o").exists()


@pytest.mark.slow
def test_trained_on_digits_it_reaches_the_stated_accuracy(tmp_path: Path) -> None:
    from sklearn.datasets import load_digits

    out = tmp_path / "vit"
    zoo_ok("train", "vit-tiny", "--task", "classify", "--steps", str(STEPS), "-o", out)
    scores = json.loads((out / "eval.json").read_text())
    assert scores["accuracy"] >= ACCURACY, scores["accuracy"]
    zoo_ok("export", out, "--onnx", "--out", tmp_path / "onnx")
    digits = load_digits()
    image = tmp_path / "digit.png"
    pixels = np.rint(digits.images[0] * 255 / 16).astype(np.uint8)  # a 0
    Image.fromarray(pixels, "L").save(image)
    result = json.loads(zoo_ok("run", tmp_path / "onnx", "--image", image, "--json"))
    assert result["labels"][int(np.argmax(result["probabilities"][0]))] == "0"
