"""An encoder over an image (ViT): the encoder (zoo/models/encoder.py) with the patch stem
(zoo/blocks/patches.py) as its embeddings, its layers and final norm, then its heads (the class
token's vector, the classifier on it, BERT's pooler where the card has one). Every position is
real: there is no padding mask."""

from __future__ import annotations

import torch

from zoo.blocks.heads import HeadInputs, run_heads
from zoo.models.encoder import Encoder


class ImageEncoder(Encoder):
    def forward(self, pixel_values: torch.Tensor  # type: ignore[override]
                ) -> dict[str, torch.Tensor]:
        """{"last_hidden_state": (B, 1 + patches, d), then each head's graph output}."""
        x = self.embeddings(pixel_values)
        for layer in self.layers:
            x, _ = layer(x, None)
        if self.final_norm is not None:
            x = self.final_norm(x)
        return run_heads(self, self.head_names, x, HeadInputs(None, None))
