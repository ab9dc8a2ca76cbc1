"""Flat-signature wrappers around each family, in the exact input/output order of the contract,
so torch.onnx sees plain tensors in and plain tensors out."""

from __future__ import annotations

import torch
from torch import nn

from zoo.blocks.attention import KeyValue


def pair_up(flat: tuple[torch.Tensor, ...]) -> tuple[KeyValue, ...]:
    return tuple((flat[i], flat[i + 1]) for i in range(0, len(flat), 2))


def flatten(pairs: tuple[KeyValue, ...]) -> tuple[torch.Tensor, ...]:
    return tuple(tensor for pair in pairs for tensor in pair)


class DecoderGraph(nn.Module):
    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, input_ids, attention_mask, position_ids, past):  # noqa: ANN001
        logits, presents = self.model(input_ids, attention_mask, position_ids, pair_up(past))
        return (logits, *flatten(presents))


class EncoderGraph(nn.Module):
    """last_hidden_state, then each head's output in the order the heads declare them."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, input_ids, attention_mask, token_type_ids=None):  # noqa: ANN001
        return tuple(self.model(input_ids, attention_mask, token_type_ids).values())


class SourceEncoderGraph(nn.Module):
    """The encoder half of the encoder-decoder."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, input_ids, attention_mask):  # noqa: ANN001
        return self.model.encode(input_ids, attention_mask)


class TargetDecoderGraph(nn.Module):
    """The decoder half of the encoder-decoder, with its self-attention cache."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, input_ids, encoder_hidden_states, encoder_attention_mask, past):  # noqa: ANN001
        logits, presents = self.model.decode(input_ids, encoder_hidden_states,
                                             encoder_attention_mask, pair_up(past))
        return (logits, *flatten(presents))
