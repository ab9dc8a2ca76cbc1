"""BERT-style encoder: token, position and token-type embeddings, layers, then its heads (the
pooler, the MLM head, and any registered in zoo/blocks/heads.py)."""

from __future__ import annotations

import torch
from torch import nn

from zoo.blocks.embeddings import Embeddings
from zoo.blocks.layer import Layer
from zoo.blocks.windows import LocalAttention
from zoo.models.sequence import run_sequence


class Encoder(nn.Module):
    def __init__(
        self,
        embeddings: Embeddings | nn.Module,  # an image encoder's: the patch stem
        layers: list[Layer],
        final_norm: nn.Module | None,
        heads: dict[str, nn.Module],
        local_attention: LocalAttention | None = None,
    ) -> None:
        super().__init__()
        self.embeddings = embeddings
        self.local_attention = local_attention  # the local layers' window, if it has any
        self.layers = nn.ModuleList(layers)
        self.final_norm = final_norm
        for name, head in heads.items():  # by name, so weights keep their names (pooler.*)
            self.add_module(name, head)
        self.head_names = list(heads)

    def attention_groups(self) -> dict[str, list[nn.Module]]:
        """The attention modules by the name their maps go under (Hugging Face's)."""
        return {"attentions": [layer.self_attention for layer in self.layers]}

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        token_type_ids: torch.Tensor | None = None,
    ) -> dict[str, torch.Tensor]:
        """{"last_hidden_state": (B, T, d), then each head's graph output, in head order}."""
        return run_sequence(self, input_ids, attention_mask, causal=False,
                            token_type_ids=token_type_ids)
