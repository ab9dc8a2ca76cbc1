"""Checks shared by the tests that import a transformers decoder (Llama family, Gemma, mixtures
of experts) and compare the zoo's model with it."""

from __future__ import annotations

from typing import Any

import torch


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
