"""transformers.js's `automatic-speech-recognition` pipeline and AutoModelForSpeechSeq2Seq
(@huggingface/transformers in Node.js) load a Whisper export as it is (config.json,
generation_config.json, preprocessor_config.json, the tokenizer, onnx/encoder_model.onnx and
onnx/decoder_model_merged.onnx): greedy tokens equal transformers' own model's (language
forced), the pipeline's text `zoo run --audio`'s. Slow: a tiny
Whisper is made, imported and exported.

Needs `node` and `npm ci --ignore-scripts` in examples/transformers-js (`make node-deps`);
skips where they are missing, except under ZOO_REQUIRE_NODE_WEB=1 (.ci/run)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from tests.support.helpers import zoo_ok
from tests.support.js import SCRIPT, require, run_node, transformers_js_problem
from tests.support.whisper_folder import exported_with_clip

pytest.importorskip("transformers")
pytest.importorskip("soundfile")


@pytest.mark.slow
def test_speech_recognition_gives_transformers_tokens(tmp_path: Path) -> None:
    require(transformers_js_problem())
    _, reference, export, features = exported_with_clip(tmp_path)
    # Without timestamps only: transformers.js 4.3.2's WhisperTimeStampLogitsProcessor is an
    # older algorithm than transformers' (no bound on the first timestamp, whose check comes
    # after a `continue`; no rule that timestamps never go back), so with timestamps the two
    # clients choose differently whatever the export.
    with torch.no_grad():
        expected = reference.generate(features, language="en", task="transcribe")[0].tolist()
    result = run_node(SCRIPT, str(export), "automatic-speech-recognition", "--audio",
                      str(tmp_path / "clip.wav"), "--language", "en", "--max-new-tokens", "60",
                      timeout=300)
    assert result.returncode == 0, result.stderr
    got = json.loads(result.stdout)
    prompt = [257, 258, 261, 265]
    assert got["tokens"][0] in (expected, prompt + expected)  # with or without the prompt
    printed = zoo_ok("run", export, "--audio", tmp_path / "clip.wav", "--language", "en")
    assert got["texts"][0].strip() == printed.strip()
