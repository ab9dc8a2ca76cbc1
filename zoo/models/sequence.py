"""The whole sequence through one stack at once, then its heads: what the encoder runs, and
a decoder that carries a pooling (a sequence model: no cache)."""

from __future__ import annotations

import torch
from torch import nn

from zoo.blocks.attention import build_mask, padded_positions, with_position_bias
from zoo.blocks.heads import HeadInputs, run_heads


def run_sequence(model: nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor | None,
                 causal: bool, token_type_ids: torch.Tensor | None = None
                 ) -> dict[str, torch.Tensor]:
    """`model` has `embeddings`, `layers`, `final_norm` and `head_names`. Positions count real
    tokens, so left and right padding give each row's unpadded result."""
    length = input_ids.shape[1]
    position_ids = padded_positions(input_ids, attention_mask)
    x = model.embeddings(input_ids, position_ids, token_type_ids)
    mask = build_mask(attention_mask, length, length, causal=causal, device=input_ids.device,
                      dtype=x.dtype)  # once per forward, added in every layer
    mask = with_position_bias(model.embeddings.position, mask, length, length)
    rotary = model.embeddings.position.rotary(position_ids)
    contexts = {False: (mask, rotary)}
    local = getattr(model, "local_attention", None)
    if local is not None:
        contexts[True] = local.context(model.embeddings.position, attention_mask, length,
                                       length, causal, position_ids, rotary, x.dtype)
    for layer in model.layers:
        layer_mask, layer_rotary = contexts[layer.local]
        x, _ = layer(x, layer_mask, rotary=layer_rotary)
    if model.final_norm is not None:
        x = model.final_norm(x)
    return run_heads(model, model.head_names, x,
                     HeadInputs(attention_mask, model.embeddings.token.weight))
