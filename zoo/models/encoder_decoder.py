"""The original Transformer: an encoder stack and a decoder stack with cross-attention.

`encode()` runs once per input and `cross_cache()` projects its output, once, to every decoder
layer's cross-attention keys and values; `decode()` runs per step with both caches explicit
(tensors in, tensors out). Source and target share one embedding (and the output head) when
the card ties them. A position block that is one per stack (T5's relative bias: bidirectional
in the encoder, causal in the decoder) gives the decoder its own, `decoder_position`.
"""

from __future__ import annotations

import torch
from torch import nn

from zoo.blocks.attention import KeyValue, build_mask, padded_positions, with_position_bias
from zoo.blocks.embeddings import Embeddings
from zoo.blocks.heads import LMHead
from zoo.blocks.layer import Layer


class EncoderDecoder(nn.Module):
    def __init__(
        self,
        source_embeddings: Embeddings,
        target_embeddings: Embeddings | None,
        encoder_layers: list[Layer],
        decoder_layers: list[Layer],
        encoder_norm: nn.Module | None,
        decoder_norm: nn.Module | None,
        head: LMHead,
        decoder_position: nn.Module | None = None,
    ) -> None:
        super().__init__()
        self.source_embeddings = source_embeddings
        self.target_embeddings = target_embeddings  # None: shared with the source
        self.encoder_layers = nn.ModuleList(encoder_layers)
        self.decoder_layers = nn.ModuleList(decoder_layers)
        self.encoder_norm = encoder_norm
        self.decoder_norm = decoder_norm
        self.head = head
        self.decoder_position = decoder_position  # None: the target embeddings' position

    def _target(self) -> Embeddings:
        return self.source_embeddings if self.target_embeddings is None else self.target_embeddings

    def encode(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None
    ) -> torch.Tensor:
        """Source ids (B, S) and mask (B, S) to memory (B, S, d)."""
        length = input_ids.shape[1]
        position_ids = padded_positions(input_ids, attention_mask)
        x = self.source_embeddings(input_ids, position_ids)
        rotary = self.source_embeddings.position.rotary(position_ids)
        mask = build_mask(attention_mask, length, length, causal=False, dtype=x.dtype)
        mask = with_position_bias(self.source_embeddings.position, mask, length, length)
        for layer in self.encoder_layers:
            x, _ = layer(x, mask, rotary=rotary)
        return self.encoder_norm(x) if self.encoder_norm is not None else x

    def cross_cache(self, memory: torch.Tensor) -> tuple[KeyValue, ...]:
        """Memory (B, S, d) to each decoder layer's cross-attention (key, value),
        (B, n_heads, S, head_dim): what decoding steps would otherwise recompute every step."""
        return tuple(layer.cross_attention.project(memory) for layer in self.decoder_layers)

    def decode(
        self,
        input_ids: torch.Tensor,
        cross: tuple[KeyValue, ...],
        memory_mask: torch.Tensor | None = None,
        past_key_values: tuple[KeyValue, ...] | None = None,
    ) -> tuple[torch.Tensor, tuple[KeyValue, ...]]:
        """Target ids (B, T) after `past` cached steps, attending to the source through its
        `cross_cache`; returns logits (B, T, vocab) and the self-attention cache, one
        (key, value) per layer, (B, n_heads, past + T, head_dim)."""
        length = input_ids.shape[1]
        past_length = past_key_values[0][0].shape[2] if past_key_values else 0
        position_ids = padded_positions(input_ids, None, past_length)
        embeddings = self._target()
        x = embeddings(input_ids, position_ids)
        position = (embeddings.position if self.decoder_position is None
                    else self.decoder_position)
        rotary = position.rotary(position_ids)
        self_mask = build_mask(None, length, past_length + length, causal=True,
                               device=input_ids.device, dtype=x.dtype)
        self_mask = with_position_bias(position, self_mask, length, past_length + length)
        cross_mask = build_mask(memory_mask, length, cross[0][0].shape[2], causal=False,
                                dtype=x.dtype)
        presents = []
        for index, layer in enumerate(self.decoder_layers):
            past = past_key_values[index] if past_key_values else None
            x, present = layer(x, self_mask, past=past, rotary=rotary, memory=cross[index],
                               memory_mask=cross_mask)
            presents.append(present)
        if self.decoder_norm is not None:
            x = self.decoder_norm(x)
        return self.head(x, embeddings.token.weight), tuple(presents)

    def attention_groups(self) -> dict[str, list[nn.Module]]:
        """The attention modules by the name their maps go under (Hugging Face's)."""
        return {"encoder_attentions": [layer.self_attention for layer in self.encoder_layers],
                "decoder_attentions": [layer.self_attention for layer in self.decoder_layers],
                "cross_attentions": [layer.cross_attention for layer in self.decoder_layers]}

    def forward(
        self,
        input_ids: torch.Tensor,
        decoder_input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Teacher-forced logits (B, T, vocab) for training."""
        memory = self.encode(input_ids, attention_mask)
        logits, _ = self.decode(decoder_input_ids, self.cross_cache(memory), attention_mask)
        return logits
