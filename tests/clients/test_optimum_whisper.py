"""Optimum's ORTModelForSpeechSeq2Seq (with transformers' AutoFeatureExtractor reading the
export's preprocessor_config.json) loads a Whisper export's onnx/ layout as it is, and its
greedy `generate` (language forced, with and without timestamps) gives transformers' own
model's tokens on the same audio. Runs in examples/optimum/.venv (tests/support/optimum.py
says when it skips); slow: a tiny Whisper is made, imported and exported."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
import torch

from tests.support.optimum import PYTHON, RUNNER, require_optimum
from tests.support.whisper_folder import exported_with_clip

pytest.importorskip("transformers")
pytest.importorskip("soundfile")


@pytest.mark.slow
@pytest.mark.parametrize("timestamps", [False, True])
def test_ort_model_for_speech_seq2seq_gives_transformers_tokens(tmp_path: Path,
                                                                timestamps: bool) -> None:
    require_optimum()
    _, reference, export, features = exported_with_clip(tmp_path)
    with torch.no_grad():
        output = reference.generate(features, language="en", task="transcribe",
                                    return_timestamps=timestamps, return_dict_in_generate=True)
    expected = (output["segments"][0][-1]["result"]["sequences"] if timestamps
                else output["sequences"][0]).tolist()
    flags = ["--timestamps"] if timestamps else []
    done = subprocess.run([str(PYTHON), str(RUNNER), str(export), "speech-recognition",
                           "--audio", str(tmp_path / "clip.wav"), "--language", "en",
                           "--max-new-tokens", "60", *flags],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    got = json.loads(done.stdout)["tokens"][0]
    prompt = [257, 258, 261] + ([] if timestamps else [265])
    assert expected[:len(prompt)] == prompt
    new = expected[len(prompt):]
    if timestamps:  # both return the text up to the last whole segment: the same cut
        returned = output["sequences"][0].tolist()
        new = returned[len(prompt):] if returned[:len(prompt)] == prompt else returned
        assert new == expected[len(prompt):len(prompt) + len(new)] and len(new) > 4
    assert got in (new, prompt + new), (got, new)  # transformers 4.57 keeps the prompt or not
