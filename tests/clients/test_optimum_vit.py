"""Optimum's ORTModelForImageClassification (with transformers' AutoImageProcessor reading the
export's preprocessor_config.json) loads a ViT export as it is and gives `zoo run --image`'s
labels and probabilities: images of other sizes and modes too, since transformers 4.57's
ViTImageProcessor resizes with Pillow as the zoo does. Runs in examples/optimum/.venv
(tests/support/optimum.py says when it skips)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import numpy as np
import pytest

from tests.support.helpers import zoo_ok
from tests.support.optimum import PYTHON, RUNNER, require_optimum

Image = pytest.importorskip("PIL.Image")


def test_ort_model_for_image_classification_gives_zoo_runs_labels(tmp_path: Path) -> None:
    require_optimum()
    folder = tmp_path / "vit-tiny"
    zoo_ok("export", "vit-tiny", "--onnx", "--optimize", "--out", folder)
    rng = np.random.default_rng(7)
    images = []
    for index, (mode, size) in enumerate([("RGB", (32, 32)), ("RGB", (57, 40)),
                                          ("L", (20, 64))]):
        shape = (size[1], size[0], 3) if mode == "RGB" else (size[1], size[0])
        images.append(tmp_path / f"{index}.png")
        Image.fromarray(rng.integers(0, 256, shape, dtype=np.uint8), mode).save(images[-1])
    args = [arg for image in images for arg in ("--image", str(image))]
    expected = json.loads(zoo_ok("run", folder, *args, "--json"))
    done = subprocess.run([str(PYTHON), str(RUNNER), str(folder), "image-classification", *args],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    got = json.loads(done.stdout)
    for row, scores in enumerate(got["scores"]):
        probabilities = expected["probabilities"][row]
        assert got["labels"][row] == expected["labels"][int(np.argmax(probabilities))]
        np.testing.assert_allclose([scores[label] for label in expected["labels"]],
                                   probabilities, atol=1e-5)
