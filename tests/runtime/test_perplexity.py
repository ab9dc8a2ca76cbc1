"""Perplexity of a decoder export on a text (issue #14): ONNX Runtime's figure against one
computed here from the PyTorch model's logits with torch's own cross-entropy."""

from __future__ import annotations

import math
import re
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from click.testing import CliRunner

from cli import main
from export.opening import open_export
from registry.errors import ZooError
from runtime.files.tokenizer import BYTE_TOKENIZER, ByteTokenizer
from runtime.perplexity import TextScore, score_text, text_windows, top1_agreement
from tests.conftest import card, on_shared, random_ids
from zoo.assemble import build_model

# Reads the session's shared gpt-tiny export, in the worker that holds it.
pytestmark = on_shared("gpt-tiny")

TOKENS = 300  # windows of 128, 128 and 44 on gpt-tiny: the short last window is covered


def reference(ids: torch.Tensor, window: int) -> tuple[float, int, torch.Tensor]:
    """Summed NLL, prediction count and argmaxes: the shared export's model (seed 1), eager."""
    model = build_model(card("gpt-tiny"), seed=1).eval()
    total, count, best = 0.0, 0, []
    with torch.no_grad():
        for start in range(0, len(ids), window):
            chunk = ids[start:start + window][None]
            if chunk.shape[1] < 2:
                continue
            positions = torch.arange(chunk.shape[1])[None]
            logits, _ = model(chunk, torch.ones_like(chunk), positions, None)
            total += F.cross_entropy(logits[0, :-1].double(), chunk[0, 1:],
                                     reduction="sum").item()
            count += chunk.shape[1] - 1
            best.append(logits[0, :-1].argmax(-1))
    return total, count, torch.cat(best)


@pytest.fixture(scope="module")
def ids() -> list[int]:
    return random_ids(card("gpt-tiny"), 1, TOKENS, seed=3)[0].tolist()


@pytest.mark.parametrize("window", [None, 70])  # both leave a short last window
def test_ort_perplexity_matches_torch_cross_entropy(shared_export, ids: list[int],
                                                    window: int | None) -> None:
    folder, _ = shared_export("gpt-tiny")
    result = score_text(open_export(folder), ids, window)
    nll, count, best = reference(torch.tensor(ids), window or 128)
    assert result.predictions == count == TOKENS - math.ceil(TOKENS / (window or 128))
    assert result.nll == pytest.approx(nll, rel=1e-5)
    assert result.perplexity == pytest.approx(math.exp(nll / count), rel=1e-5)
    assert (result.top1 == best.numpy()).mean() > 0.99  # near-ties may flip across engines


def test_top1_agreement() -> None:
    a = TextScore(4, 1.0, np.array([1, 2, 3, 4]))
    assert top1_agreement(a, a) == 1.0
    assert top1_agreement(a, TextScore(4, 1.0, np.array([1, 2, 0, 0]))) == 0.5
    with pytest.raises(ZooError, match="different positions"):
        top1_agreement(a, TextScore(3, 1.0, np.array([1, 2, 3])))


def test_windows_and_refusals(shared_export) -> None:
    assert [len(w) for w in text_windows(list(range(11)), 5)] == [5, 5]  # a lone token: dropped
    with pytest.raises(ZooError, match="too short"):
        text_windows([7], 5)
    folder, _ = shared_export("gpt-tiny")
    with pytest.raises(ZooError, match="longer than max_positions"):
        score_text(open_export(folder), list(range(3, 20)), window=129)


def test_zoo_evaluate_text(shared_export, tmp_path: Path) -> None:
    shared, _ = shared_export("gpt-tiny")
    folder = tmp_path / "export"
    shutil.copytree(shared, folder)  # the shared export has no tokenizer: add the byte one
    (folder / BYTE_TOKENIZER).write_text(ByteTokenizer().to_json())
    text = tmp_path / "held.txt"
    text.write_text("ROMEO: What light through yonder window breaks?\n" * 4)
    result = CliRunner().invoke(main, ["evaluate", str(folder), "--text", str(text)])
    assert result.exit_code == 0, result.output
    figure = re.search(r"perplexity [\d.]+ \([\d.]+ nats/token, (\d+) predictions",
                       result.output)
    assert figure and int(figure[1]) == len(text.read_bytes()) - 2  # windows of 128 and 68
    result = CliRunner().invoke(main, ["evaluate", str(folder), "--text", str(text),
                                       "--data", str(text)])
    assert result.exit_code == 2 and "give one of" in result.output
