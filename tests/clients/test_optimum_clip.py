"""Optimum's ORTModelForZeroShotImageClassification (with transformers' AutoTokenizer and
AutoImageProcessor reading the export's tokenizer.json and preprocessor_config.json) loads a
CLIP export's onnx/model.onnx as it is and gives `zoo run --image --labels`' scores: images of
other sizes and modes too (transformers 4.57's CLIPImageProcessor resizes with Pillow as the
zoo does). Runs in examples/optimum/.venv (tests/support/optimum.py says when it skips). Slow:
an import and an export of its own (tests/imports/test_clip.py checks the numbers in Python)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import numpy as np
import pytest

from tests.support.clip_folders import tiny_clip_folder
from tests.support.helpers import zoo_ok
from tests.support.optimum import PYTHON, RUNNER, require_optimum

Image = pytest.importorskip("PIL.Image")
pytest.importorskip("transformers")


@pytest.mark.slow
def test_ort_model_for_zero_shot_image_classification_gives_zoo_runs_scores(
        tmp_path: Path) -> None:
    require_optimum()
    tiny_clip_folder(tmp_path / "hf")
    zoo_ok("import", tmp_path / "hf", "-o", tmp_path / "built")
    folder = tmp_path / "clip-tiny"
    zoo_ok("export", tmp_path / "built", "--onnx", "--out", folder)
    rng = np.random.default_rng(8)
    images = []
    for index, (mode, size) in enumerate([("RGB", (32, 32)), ("RGB", (57, 40)),
                                          ("L", (20, 64))]):
        shape = (size[1], size[0], 3) if mode == "RGB" else (size[1], size[0])
        images.append(tmp_path / f"{index}.png")
        Image.fromarray(rng.integers(0, 256, shape, dtype=np.uint8), mode).save(images[-1])
    labels = ["cat", "dog", "do cat"]
    args = [arg for image in images for arg in ("--image", str(image))]
    expected = json.loads(zoo_ok("run", folder, *args, "--labels", ",".join(labels), "--json"))
    done = subprocess.run([str(PYTHON), str(RUNNER), str(folder),
                           "zero-shot-image-classification", *args,
                           *[arg for label in labels for arg in ("--label", label)]],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    got = json.loads(done.stdout)
    for row, scores in enumerate(got["scores"]):
        probabilities = expected["probabilities"][row]
        assert got["labels"][row] == labels[int(np.argmax(probabilities))]
        np.testing.assert_allclose([scores[label] for label in labels], probabilities,
                                   atol=1e-5)
