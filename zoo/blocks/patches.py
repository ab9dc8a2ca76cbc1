"""A ViT's input stem (Dosovitskiy et al. 2020; registry/stems.py declares it): the image cut
into patches, each projected to d_model, a class token before them, a learned position added
to each. Its tensors keep the shapes of transformers' ViTEmbeddings, so an import renames them
and nothing else, or (`zoo import --image-size`) resizes the position table to another grid."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import torch
from torch import nn
from torch.nn import functional

from registry.stems import num_patches

INIT_STD = 0.02


class PatchEmbedding(nn.Module):
    reads = ("d_model", "image_size", "patch_size", "channels", "dropout")

    @classmethod
    def from_card(cls, card: Mapping[str, Any], layer: int | None) -> PatchEmbedding:
        return cls(card["d_model"], card["image_size"], card["patch_size"], card["channels"],
                   card["dropout"])

    def __init__(self, d_model: int, image_size: int, patch_size: int, channels: int,
                 dropout: float) -> None:
        super().__init__()
        self.image_size, self.channels = image_size, channels
        # a stride of one patch: each output pixel is a linear map of one flattened patch
        self.projection = nn.Conv2d(channels, d_model, patch_size, stride=patch_size)
        self.class_token = nn.Parameter(torch.randn(1, 1, d_model) * INIT_STD)
        patches = num_patches({"image_size": image_size, "patch_size": patch_size})
        self.positions = nn.Parameter(torch.randn(1, patches + 1, d_model) * INIT_STD)
        self.dropout = nn.Dropout(dropout)

    def forward(self, pixel_values: torch.Tensor) -> torch.Tensor:
        """(B, channels, image_size, image_size) -> (B, 1 + patches, d_model)."""
        patches = self.projection(pixel_values).flatten(2).transpose(1, 2)  # (B, N, d)
        tokens = self.class_token.expand(patches.shape[0], -1, -1)
        return self.dropout(torch.cat([tokens, patches], dim=1) + self.positions)


def interpolated_positions(positions: torch.Tensor, side: int) -> torch.Tensor:
    """A position table (1, 1 + g * g, d) learned for a g x g patch grid, for a side x side
    grid: the class token's row kept, the patches' resized bicubically (align_corners False),
    as transformers' ViTEmbeddings.interpolate_pos_encoding computes it at every forward. Done
    once here, so the graph keeps one fixed image size."""
    grid, dim = math.isqrt(positions.shape[1] - 1), positions.shape[-1]
    patches = positions[:, 1:].reshape(1, grid, grid, dim).permute(0, 3, 1, 2)
    patches = functional.interpolate(patches, size=(side, side), mode="bicubic",
                                     align_corners=False)
    return torch.cat([positions[:, :1], patches.permute(0, 2, 3, 1).reshape(1, -1, dim)], dim=1)
