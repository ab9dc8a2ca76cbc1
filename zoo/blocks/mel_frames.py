"""Whisper's input stem (Radford et al. 2022; registry/stems.py declares it): log-mel frames
(B, n_mels, frames) through Conv1d(kernel 3) and GELU, then Conv1d(kernel 3, stride 2) and GELU,
which halves the frames into encoder states, plus a fixed sinusoid per state. Its tensors keep
the shapes of transformers' WhisperEncoder (conv1, conv2, embed_positions), so an import
renames them and nothing else."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import torch
from torch import nn
from torch.nn import functional as F

MAX_TIMESCALE = 10000.0


def whisper_sinusoids(length: int, channels: int) -> torch.Tensor:
    """Whisper's table (length, channels): sines in the first half, cosines in the second, at
    timescales spaced geometrically from 1 to 10000 over the half *inclusive* of both ends
    (log(10000) / (channels/2 - 1)), which is not Vaswani et al.'s spacing."""
    half = channels // 2
    increment = math.log(MAX_TIMESCALE) / (half - 1)
    inverse = torch.exp(-increment * torch.arange(half, dtype=torch.float64))
    angle = torch.arange(length, dtype=torch.float64)[:, None] * inverse[None, :]
    return torch.cat([angle.sin(), angle.cos()], dim=1).float()


class MelFrameStem(nn.Module):
    reads = ("d_model", "n_mels", "max_source_positions", "dropout")

    @classmethod
    def from_card(cls, card: Mapping[str, Any], layer: int | None) -> MelFrameStem:
        return cls(card["d_model"], card["n_mels"], card["max_source_positions"],
                   card["dropout"])

    def __init__(self, d_model: int, n_mels: int, max_source_positions: int,
                 dropout: float) -> None:
        super().__init__()
        self.n_mels, self.max_source_positions = n_mels, max_source_positions
        self.conv1 = nn.Conv1d(n_mels, d_model, kernel_size=3, padding=1)
        self.conv2 = nn.Conv1d(d_model, d_model, kernel_size=3, stride=2, padding=1)
        # a frozen weight, not a buffer: transformers saves (and counts) it, an import reads it
        self.positions = nn.Parameter(whisper_sinusoids(max_source_positions, d_model),
                                      requires_grad=False)
        self.dropout = nn.Dropout(dropout)

    def forward(self, input_features: torch.Tensor) -> torch.Tensor:
        """(B, n_mels, frames) -> (B, ceil(frames / 2), d_model); Whisper's frames are
        2 * max_source_positions (30 s), fewer read the first positions."""
        x = F.gelu(self.conv1(input_features))
        x = F.gelu(self.conv2(x)).transpose(1, 2)  # (B, states, d)
        return self.dropout(x + self.positions[: x.shape[1]])
