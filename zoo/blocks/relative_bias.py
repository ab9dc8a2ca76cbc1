"""T5's relative position bias (Raffel et al. 2020): no positions on the embeddings; each
head learns one scalar per bucket of the key's offset from the query, added to every layer's
self-attention scores (computed once per stack, as transformers' first layer computes it and
hands to the others).

Offsets below half the buckets have a bucket each; longer ones share logarithmically wider
buckets up to `relative_max_distance`, beyond which all share the last. The encoder's bias is
bidirectional (half the buckets for keys after the query); the decoder's is causal (only keys
at or before the query). Each stack has its own table: `per_stack` tells zoo/assemble.py to
build a second one, causal, for the decoder of an encoder-decoder.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import torch
from torch import nn

from registry.sizes import attention_sizes


def relative_buckets(offset: torch.Tensor, buckets: int, max_distance: int,
                     bidirectional: bool) -> torch.Tensor:
    """Bucket of each key-minus-query offset (transformers' `_relative_position_bucket`)."""
    bucket = torch.zeros_like(offset)
    if bidirectional:
        buckets //= 2
        bucket = bucket + (offset > 0).long() * buckets
        distance = offset.abs()
    else:
        distance = -torch.clamp(offset, max=0)
    exact = buckets // 2
    is_small = distance < exact
    # clamp(min=1): log(0) is never taken where the small branch is used, but keeps it finite
    large = exact + (torch.log(distance.clamp(min=1).float() / exact)
                     / math.log(max_distance / exact) * (buckets - exact)).long()
    large = torch.clamp(large, max=buckets - 1)
    return bucket + torch.where(is_small, distance, large)


class T5RelativeBias(nn.Module):
    """A position block with only the third hook, `attention_bias`; `add` and `rotary` do
    nothing. `table` is (buckets, heads), as transformers' relative_attention_bias."""

    reads = ("d_model", "n_heads", "n_kv_heads", "head_dim", "relative_buckets",
             "relative_max_distance")
    per_stack = True  # the encoder's table and the decoder's differ

    @classmethod
    def from_card(cls, card: Mapping[str, Any], layer: int | None, causal: bool = False
                  ) -> T5RelativeBias:
        return cls(attention_sizes(card).heads, card["relative_buckets"],
                   card["relative_max_distance"], causal)

    def __init__(self, heads: int, buckets: int, max_distance: int, causal: bool) -> None:
        super().__init__()
        self.table = nn.Embedding(buckets, heads)
        self.buckets, self.max_distance, self.causal = buckets, max_distance, causal

    def add(self, x: torch.Tensor, position_ids: torch.Tensor) -> torch.Tensor:
        return x

    def rotary(self, position_ids: torch.Tensor) -> None:
        return None

    def attention_bias(self, query_length: int, key_length: int) -> torch.Tensor:
        """(1, heads, T, S): the T queries are the last T of the S keys (the first S - T are
        the cache). Raw indices, not padded positions: padding is contiguous at one end, so
        the offset between two real tokens is the offset of their indices (as transformers)."""
        device = self.table.weight.device
        keys = torch.arange(key_length, device=device)
        queries = torch.arange(query_length, device=device) + (key_length - query_length)
        bucket = relative_buckets(keys[None, :] - queries[:, None], self.buckets,
                                  self.max_distance, bidirectional=not self.causal)
        return self.table(bucket).permute(2, 0, 1)[None]  # (T, S, heads) -> (1, heads, T, S)
