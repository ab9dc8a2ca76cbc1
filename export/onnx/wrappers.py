"""Flat-signature wrappers around each family, in the exact input/output order of the contract,
so torch.onnx sees plain tensors in and plain tensors out.

Asked for attention groups (`--attentions`), a wrapper runs its model with those attentions
recording their probabilities and appends them to its outputs, one (B, H, T, S) map per layer
and group, in the order of `attention_groups`. Without them it computes exactly what it did.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from zoo.blocks.attention import KeyValue, recorded_attentions

Outputs = tuple[torch.Tensor, ...]


def pair_up(flat: tuple[torch.Tensor, ...]) -> tuple[KeyValue, ...]:
    return tuple((flat[i], flat[i + 1]) for i in range(0, len(flat), 2))


def flatten(pairs: tuple[KeyValue, ...]) -> tuple[torch.Tensor, ...]:
    return tuple(tensor for pair in pairs for tensor in pair)


class Wrapper(nn.Module):
    def __init__(self, model: nn.Module, attention_groups: tuple[str, ...] = ()) -> None:
        super().__init__()
        self.model = model
        self.attention_groups = attention_groups

    def outputs(self, compute: Callable[[], Outputs]) -> Outputs:
        if not self.attention_groups:
            return compute()
        groups = self.model.attention_groups()
        with recorded_attentions({name: groups[name] for name in self.attention_groups}) as maps:
            outputs = compute()
        # each module ran once in this forward: its one map per layer
        return (*outputs, *(calls[-1] for name in self.attention_groups for calls in maps[name]))


class DecoderGraph(Wrapper):
    def forward(self, input_ids, attention_mask, position_ids, past):  # noqa: ANN001
        def compute() -> Outputs:
            logits, presents = self.model(input_ids, attention_mask, position_ids,
                                          pair_up(past))
            return (logits, *flatten(presents))

        return self.outputs(compute)


class EncoderGraph(Wrapper):
    """last_hidden_state, then each head's output in the order the heads declare them."""

    def forward(self, input_ids, attention_mask, token_type_ids=None):  # noqa: ANN001
        return self.outputs(lambda: tuple(
            self.model(input_ids, attention_mask, token_type_ids).values()))


class ImageGraph(Wrapper):
    """An encoder over pixels (a ViT): last_hidden_state, then its heads' outputs."""

    def forward(self, pixel_values):  # noqa: ANN001
        return self.outputs(lambda: tuple(self.model(pixel_values).values()))


class SequenceGraph(Wrapper):
    """A decoder with a pooling: last_hidden_state, then its heads' outputs."""

    def forward(self, input_ids, attention_mask):  # noqa: ANN001
        return self.outputs(lambda: tuple(self.model.sequence(input_ids, attention_mask).values()))


class SourceEncoderGraph(Wrapper):
    """The encoder half of the encoder-decoder: the memory, then every decoder layer's
    cross-attention keys and values of it (computed here, once per source)."""

    def forward(self, input_ids, attention_mask):  # noqa: ANN001
        def compute() -> Outputs:
            memory = self.model.encode(input_ids, attention_mask)
            return (memory, *flatten(self.model.cross_cache(memory)))

        return self.outputs(compute)


class SpeechEncoderGraph(Wrapper):
    """Whisper's encoder: the memory of the log-mel frames, then every decoder layer's
    cross-attention keys and values of it (computed here, once per clip)."""

    def forward(self, input_features):  # noqa: ANN001
        def compute() -> Outputs:
            memory = self.model.encode(input_features)
            return (memory, *flatten(self.model.cross_cache(memory)))

        return self.outputs(compute)


class SpeechDecoderGraph(Wrapper):
    """Whisper's decoder: as TargetDecoderGraph, with no source mask (every frame is real)."""

    def forward(self, input_ids, past):  # noqa: ANN001
        def compute() -> Outputs:
            pairs = pair_up(past)
            logits, presents = self.model.decode(input_ids, pairs[1::2], None, pairs[0::2])
            return (logits, *flatten(presents))

        return self.outputs(compute)


class TargetDecoderGraph(Wrapper):
    """The decoder half of the encoder-decoder. `past` holds per layer the self-attention
    key and value, then the cross-attention key and value (Optimum's order); only the self
    cache comes back."""

    def forward(self, input_ids, encoder_attention_mask, past):  # noqa: ANN001
        def compute() -> Outputs:
            pairs = pair_up(past)
            logits, presents = self.model.decode(input_ids, pairs[1::2], encoder_attention_mask,
                                                 pairs[0::2])
            return (logits, *flatten(presents))

        return self.outputs(compute)
