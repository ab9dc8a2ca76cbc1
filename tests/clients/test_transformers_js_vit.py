"""transformers.js's `image-classification` pipeline (@huggingface/transformers in Node.js)
loads a ViT export as it is (config.json, preprocessor_config.json, onnx/model.onnx) and gives
`zoo run --image`'s labels and probabilities. The images are PNGs at the model's size: a
resize is the clients' own (transformers.js resizes with sharp, the zoo with Pillow as
transformers' ViTImageProcessor does), and at the model's size there is none.

Needs `node` and `npm ci --ignore-scripts` in examples/transformers-js (`make node-deps`);
skips where they are missing, except under ZOO_REQUIRE_NODE_WEB=1 (.ci/run)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from tests.support.helpers import zoo_ok
from tests.support.js import SCRIPT, require, run_node, transformers_js_problem

Image = pytest.importorskip("PIL.Image")


def test_image_classification_pipeline_gives_zoo_runs_labels(tmp_path: Path) -> None:
    require(transformers_js_problem())
    folder = tmp_path / "vit-tiny"
    zoo_ok("export", "vit-tiny", "--onnx", "--out", folder)
    rng = np.random.default_rng(5)
    images = []
    for index, mode in enumerate(("RGB", "RGB", "L")):
        shape = (32, 32, 3) if mode == "RGB" else (32, 32)
        images.append(tmp_path / f"{index}.png")
        Image.fromarray(rng.integers(0, 256, shape, dtype=np.uint8), mode).save(images[-1])
    args = [arg for image in images for arg in ("--image", str(image))]
    expected = json.loads(zoo_ok("run", folder, *args, "--json"))
    result = run_node(SCRIPT, str(folder), "image-classification", *args, timeout=120)
    assert result.returncode == 0, result.stderr
    got = json.loads(result.stdout)
    for row, scores in enumerate(got["scores"]):
        probabilities = expected["probabilities"][row]
        assert got["labels"][row] == expected["labels"][int(np.argmax(probabilities))]
        np.testing.assert_allclose([scores[label] for label in expected["labels"]],
                                   probabilities, atol=1e-5)
