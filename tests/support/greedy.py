"""Greedy decoding references: loops written here over PyTorch (the zoo's own model or
transformers') that the tests compare the exports' tokens with."""

from __future__ import annotations

from pathlib import Path

import torch

from zoo.files.weights import load_built


def torch_greedy(folder: Path, prompt: list[int], steps: int) -> list[int]:
    """Argmax of the last position, the whole sequence run again each step."""
    model, _ = load_built(folder)
    ids = list(prompt)
    with torch.no_grad():
        for _ in range(steps):
            tensor = torch.tensor([ids])
            logits, _ = model(tensor, torch.ones_like(tensor))
            ids.append(int(logits[0, -1].argmax()))
    return ids[len(prompt):]
