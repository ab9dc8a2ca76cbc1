"""GPT-style decoder: embeddings, causal layers, final norm, LM head tied to the embedding.

With a pooling in its card it is a sequence model instead (a classifier or an embedder, as
GPT2ForSequenceClassification): no LM head and no cache; `forward` returns, like the encoder,
{"last_hidden_state", then its heads' outputs} (zoo/blocks/heads.py: SEQUENCE_HEADS)."""

from __future__ import annotations

import torch
from torch import nn

from zoo.blocks.attention import KeyValue, build_mask, padded_positions, with_position_bias
from zoo.blocks.embeddings import Embeddings
from zoo.blocks.heads import LMHead
from zoo.blocks.layer import Layer
from zoo.blocks.windows import LocalAttention
from zoo.models.sequence import run_sequence


class Decoder(nn.Module):
    def __init__(
        self,
        embeddings: Embeddings,
        layers: list[Layer],
        final_norm: nn.Module | None,
        head: LMHead | None,
        heads: dict[str, nn.Module] | None = None,
        local_attention: LocalAttention | None = None,
    ) -> None:
        super().__init__()
        self.embeddings = embeddings
        self.local_attention = local_attention  # the local layers' window, if it has any
        self.layers = nn.ModuleList(layers)
        self.final_norm = final_norm
        self.head = head
        for name, sequence_head in (heads or {}).items():
            self.add_module(name, sequence_head)
        self.head_names = list(heads or {})

    def attention_groups(self) -> dict[str, list[nn.Module]]:
        """The attention modules by the name their maps go under (Hugging Face's)."""
        return {"attentions": [layer.self_attention for layer in self.layers]}

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None,
        past_key_values: tuple[KeyValue, ...] | None = None,
    ) -> tuple[torch.Tensor, tuple[KeyValue, ...]] | dict[str, torch.Tensor]:
        """input_ids (B, T); attention_mask (B, past + T), 1 for real tokens; position_ids (B, T).

        Returns logits (B, T, vocab) and the cache, one (key, value) per layer, each
        (B, n_heads, past + T, head_dim). A sequence model returns its outputs' dict.
        """
        if self.head is None:
            return self.sequence(input_ids, attention_mask)
        batch, length = input_ids.shape
        past_length = past_key_values[0][0].shape[2] if past_key_values else 0
        if position_ids is None:
            position_ids = padded_positions(input_ids, None, past_length)
        x = self.embeddings(input_ids, position_ids)
        mask = build_mask(attention_mask, length, past_length + length, causal=True,
                          device=input_ids.device, dtype=x.dtype)  # once, added in every layer
        mask = with_position_bias(self.embeddings.position, mask, length, past_length + length)
        rotary = self.embeddings.position.rotary(position_ids)
        contexts = {False: (mask, rotary)}
        if self.local_attention is not None:
            contexts[True] = self.local_attention.context(
                self.embeddings.position, attention_mask, length, past_length + length, True,
                position_ids, rotary, x.dtype)
        presents = []
        for index, layer in enumerate(self.layers):
            past = past_key_values[index] if past_key_values else None
            layer_mask, layer_rotary = contexts[layer.local]
            x, present = layer(x, layer_mask, past=past, rotary=layer_rotary)
            presents.append(present)
        if self.final_norm is not None:
            x = self.final_norm(x)
        return self.head(x, self.embeddings.token.weight), tuple(presents)

    def sequence(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None
                 ) -> dict[str, torch.Tensor]:
        """The whole sequence at once, positions counted over real tokens (either padding)."""
        return run_sequence(self, input_ids, attention_mask, causal=True)
