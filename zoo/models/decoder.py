"""GPT-style decoder: embeddings, causal layers, final norm, LM head tied to the embedding."""

from __future__ import annotations

import torch
from torch import nn

from zoo.blocks.attention import KeyValue, build_mask, padded_positions
from zoo.blocks.embeddings import Embeddings
from zoo.blocks.heads import LMHead
from zoo.blocks.layer import Layer


class Decoder(nn.Module):
    def __init__(
        self,
        embeddings: Embeddings,
        layers: list[Layer],
        final_norm: nn.Module | None,
        head: LMHead,
    ) -> None:
        super().__init__()
        self.embeddings = embeddings
        self.layers = nn.ModuleList(layers)
        self.final_norm = final_norm
        self.head = head

    def attention_groups(self) -> dict[str, list[nn.Module]]:
        """The attention modules by the name their maps go under (Hugging Face's)."""
        return {"attentions": [layer.self_attention for layer in self.layers]}

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None,
        past_key_values: tuple[KeyValue, ...] | None = None,
    ) -> tuple[torch.Tensor, tuple[KeyValue, ...]]:
        """input_ids (B, T); attention_mask (B, past + T), 1 for real tokens; position_ids (B, T).

        Returns logits (B, T, vocab) and the cache, one (key, value) per layer, each
        (B, n_heads, past + T, head_dim).
        """
        batch, length = input_ids.shape
        past_length = past_key_values[0][0].shape[2] if past_key_values else 0
        if position_ids is None:
            position_ids = padded_positions(input_ids, None, past_length)
        mask = build_mask(attention_mask, length, past_length + length, causal=True,
                              device=input_ids.device)
        x = self.embeddings(input_ids, position_ids)
        rotary = self.embeddings.position.rotary(position_ids)
        presents = []
        for index, layer in enumerate(self.layers):
            past = past_key_values[index] if past_key_values else None
            x, present = layer(x, mask, past=past, rotary=rotary)
            presents.append(present)
        if self.final_norm is not None:
            x = self.final_norm(x)
        return self.head(x, self.embeddings.token.weight), tuple(presents)
