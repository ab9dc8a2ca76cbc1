"""transformers.js's `zero-shot-image-classification` pipeline (@huggingface/transformers in
Node.js) loads a CLIP export as it is (config.json, the tokenizer files,
preprocessor_config.json, onnx/model.onnx) and gives `zoo run --image --labels`'s labels and
scores. The images are PNGs at the model's size: a resize is the clients' own (transformers.js
resizes with sharp, the zoo with Pillow as transformers' CLIPImageProcessor does), and at the
model's size there is none.

Needs `node` and `npm ci --ignore-scripts` in examples/transformers-js (`make node-deps`);
skips where they are missing, except under ZOO_REQUIRE_NODE_WEB=1 (.ci/run). Slow: an import
and an export of their own (tests/imports/test_clip.py checks the same numbers in Python)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from tests.support.clip_folders import tiny_clip_folder
from tests.support.helpers import zoo_ok
from tests.support.js import SCRIPT, require, run_node, transformers_js_problem

Image = pytest.importorskip("PIL.Image")
pytest.importorskip("transformers")


@pytest.mark.slow
def test_zero_shot_pipeline_gives_zoo_runs_labels(tmp_path: Path) -> None:
    require(transformers_js_problem())
    tiny_clip_folder(tmp_path / "hf")
    zoo_ok("import", tmp_path / "hf", "-o", tmp_path / "built")
    folder = tmp_path / "clip-tiny"
    zoo_ok("export", tmp_path / "built", "--onnx", "--out", folder)
    rng = np.random.default_rng(6)
    images = []
    for index, mode in enumerate(("RGB", "RGB", "L")):
        shape = (32, 32, 3) if mode == "RGB" else (32, 32)
        images.append(tmp_path / f"{index}.png")
        Image.fromarray(rng.integers(0, 256, shape, dtype=np.uint8), mode).save(images[-1])
    labels, template = ["cat", "dog", "do cat"], "a {}."
    args = [arg for image in images for arg in ("--image", str(image))]
    expected = json.loads(zoo_ok("run", folder, *args, "--labels", ",".join(labels),
                                 "--template", template, "--json"))
    assert expected["labels"] == labels
    result = run_node(SCRIPT, str(folder), "zero-shot-image-classification", *args,
                      *[arg for label in labels for arg in ("--label", label)],
                      "--template", template, timeout=120)
    assert result.returncode == 0, result.stderr
    got = json.loads(result.stdout)
    for row, scores in enumerate(got["scores"]):
        probabilities = expected["probabilities"][row]
        assert got["labels"][row] == labels[int(np.argmax(probabilities))]
        np.testing.assert_allclose([scores[label] for label in labels], probabilities,
                                   atol=1e-5)
