"""Whisper (Radford et al. 2022): the encoder-decoder (zoo/models/encoder_decoder.py) whose
source is log-mel audio frames. The mel stem (zoo/blocks/mel_frames.py) stands where the source
token embeddings stand; the encoder's pre-norm layers and final norm follow, with no padding mask
(every frame is real: silence is padded in, as Whisper was trained). The decoder, its caches and
its tied head are the encoder-decoder's own."""

from __future__ import annotations

import torch

from zoo.blocks.attention import Attention, KeyValue
from zoo.models.encoder_decoder import EncoderDecoder


def _per_head(linear: torch.nn.Linear, memory: torch.Tensor, heads: int) -> torch.Tensor:
    """linear(memory) split into heads, (B, S, d) -> (B, heads, S, head_dim), as an einsum
    over the weight viewed per head: no reshape of the batch or frame axes, whose sizes a traced
    graph would compute from `input_features` (the clients' merged decoder projects the memory
    it is given, with no frames in sight)."""
    weight = linear.weight.view(heads, -1, linear.weight.shape[-1])  # (heads, hd, d)
    projected = torch.einsum("bsd,hkd->bhsk", memory, weight)
    return projected if linear.bias is None else projected + linear.bias.view(heads, 1, -1)


def cross_keys_values(attention: Attention, memory: torch.Tensor) -> KeyValue:
    """What attention.project computes (Whisper's cross-attention has no key norm)."""
    return (_per_head(attention.key, memory, attention.kv_heads),
            _per_head(attention.value, memory, attention.kv_heads))


class SpeechEncoderDecoder(EncoderDecoder):
    def encode(self, input_features: torch.Tensor,  # type: ignore[override]
               attention_mask: torch.Tensor | None = None) -> torch.Tensor:
        """Log-mel frames (B, n_mels, frames) to memory (B, frames / 2, d)."""
        x = self.source_embeddings(input_features)
        for layer in self.encoder_layers:
            x, _ = layer(x, None)
        return self.encoder_norm(x) if self.encoder_norm is not None else x

    def cross_cache(self, memory: torch.Tensor) -> tuple[KeyValue, ...]:
        return tuple(cross_keys_values(layer.cross_attention, memory)
                     for layer in self.decoder_layers)

    def forward(self, input_features: torch.Tensor,  # type: ignore[override]
                decoder_input_ids: torch.Tensor,
                attention_mask: torch.Tensor | None = None) -> torch.Tensor:
        """Teacher-forced logits (B, T, vocab)."""
        memory = self.encode(input_features)
        logits, _ = self.decode(decoder_input_ids, self.cross_cache(memory))
        return logits
