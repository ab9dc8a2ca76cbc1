"""Checks shared by the tests that import a transformers decoder (Llama family, Gemma, mixtures
of experts) and compare the zoo's model with it."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import torch

from tests.helpers import assert_one_line_error, zoo


def assert_padded_logits_match(model: torch.nn.Module, reference: Any, ids: torch.Tensor,
                               mask: torch.Tensor, atol: float) -> None:
    """The zoo's logits equal transformers' on a left-padded batch, at the real tokens (padded
    queries see no key at all: their outputs mean nothing), positions counting real tokens."""
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    with torch.no_grad():
        ours, _ = model(ids, mask, positions)
        theirs = reference(input_ids=ids, attention_mask=mask, position_ids=positions).logits
    real = mask.bool()
    assert theirs[real].abs().max() > 1.0  # logits far from zero, so the tolerance means a lot
    torch.testing.assert_close(ours[real], theirs[real], atol=atol, rtol=0)


def randomise(model: torch.nn.Module) -> torch.nn.Module:
    """Norm weights around one, biases around zero and weights far from the 0.02 init, so a
    wrong norm, bias, eps, theta, routing or expert shows in the logits."""
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            mean, std = (1.0, 0.3) if "norm" in name else (0.0, 0.3 if "bias" in name else 0.2)
            parameter.copy_(mean + std * torch.randn(parameter.shape, generator=generator))
    return model.eval()


def changed_source(source: Path, changes: dict[str, Any], tmp_path: Path) -> Path:
    """A copy of a saved transformers folder as tmp_path/src, its config.json changed."""
    folder = shutil.copytree(source, tmp_path / "src")
    path = folder / "config.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), **changes}))
    return folder


def assert_import_refused(tmp_path: Path, *parts: str) -> None:
    """`zoo import src -o out`, run in tmp_path: one line naming `parts`, and no OUT, no
    staging left."""
    before = sorted(p.name for p in tmp_path.iterdir())
    assert_one_line_error(zoo("import", "src", "-o", "out"), *parts)
    assert sorted(p.name for p in tmp_path.iterdir()) == before
