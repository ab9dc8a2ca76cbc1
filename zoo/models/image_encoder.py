"""An encoder over an image (ViT): the patch stem (zoo/blocks/patches.py), the encoder's
layers and final norm, then its heads (the class token's vector, the classifier on it, BERT's
pooler where the card has one). Every position is real: there is no padding mask."""

from __future__ import annotations

import torch
from torch import nn

from zoo.blocks.heads import HeadInputs, run_heads
from zoo.blocks.layer import Layer


class ImageEncoder(nn.Module):
    def __init__(self, embeddings: nn.Module, layers: list[Layer], final_norm: nn.Module | None,
                 heads: dict[str, nn.Module]) -> None:
        super().__init__()
        self.embeddings = embeddings
        self.layers = nn.ModuleList(layers)
        self.final_norm = final_norm
        for name, head in heads.items():  # by name, so weights keep their names (classifier.*)
            self.add_module(name, head)
        self.head_names = list(heads)

    def attention_groups(self) -> dict[str, list[nn.Module]]:
        return {"attentions": [layer.self_attention for layer in self.layers]}

    def forward(self, pixel_values: torch.Tensor) -> dict[str, torch.Tensor]:
        """{"last_hidden_state": (B, 1 + patches, d), then each head's graph output}."""
        x = self.embeddings(pixel_values)
        for layer in self.layers:
            x, _ = layer(x, None)
        if self.final_norm is not None:
            x = self.final_norm(x)
        return run_heads(self, self.head_names, x, HeadInputs(None, None))
