"""Whisper (Radford et al. 2022): the encoder-decoder (zoo/models/encoder_decoder.py) whose
source is log-mel audio frames. The mel stem (zoo/blocks/mel_frames.py) stands where the source
token embeddings stand; the encoder's pre-norm layers and final norm follow, with no padding mask
(every frame is real: silence is padded in, as Whisper was trained). The decoder, its caches and
its tied head are the encoder-decoder's own."""

from __future__ import annotations

import torch

from zoo.models.encoder_decoder import EncoderDecoder


class SpeechEncoderDecoder(EncoderDecoder):
    def encode(self, input_features: torch.Tensor,  # type: ignore[override]
               attention_mask: torch.Tensor | None = None) -> torch.Tensor:
        """Log-mel frames (B, n_mels, frames) to memory (B, frames / 2, d)."""
        x = self.source_embeddings(input_features)
        for layer in self.encoder_layers:
            x, _ = layer(x, None)
        return self.encoder_norm(x) if self.encoder_norm is not None else x

    def forward(self, input_features: torch.Tensor,  # type: ignore[override]
                decoder_input_ids: torch.Tensor,
                attention_mask: torch.Tensor | None = None) -> torch.Tensor:
        """Teacher-forced logits (B, T, vocab)."""
        memory = self.encode(input_features)
        logits, _ = self.decode(decoder_input_ids, self.cross_cache(memory))
        return logits
