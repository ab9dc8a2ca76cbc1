"""Sentence vectors and classifier outputs computed in PyTorch with the formulas written out here
(the reference of the embedding tests)."""

from __future__ import annotations

import numpy as np
import torch

from tests.conftest import card
from zoo.assemble import build_model

PROMPTS = [[72, 101, 108, 108, 111], [5, 6, 7], [72, 101, 108, 108, 111, 33, 33]]


def reference(name: str, overrides: dict, seed: int) -> tuple[np.ndarray, np.ndarray | None]:
    """Each prompt alone (no padding): the mean of its hidden states over its tokens, scaled
    to unit length, and softmax(W v + b) of that vector."""
    model = build_model(card(name, **overrides), seed=seed)
    vectors, probabilities = [], []
    with torch.no_grad():
        for prompt in PROMPTS:
            ids = torch.tensor([prompt])
            out = model(ids, torch.ones_like(ids))
            hidden = out["last_hidden_state"][0].double()
            mean = hidden.sum(0) / len(prompt)
            vector = mean / torch.sqrt((mean * mean).sum())
            vectors.append(vector.numpy())
            if "logits" in out:
                layer = model.classifier.linear
                logits = layer.weight.double() @ vector + layer.bias.double()
                probabilities.append(torch.softmax(logits, 0).numpy())
    return np.stack(vectors), np.stack(probabilities) if probabilities else None
