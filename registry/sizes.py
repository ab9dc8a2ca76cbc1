"""Sizes derived from a card's fields, worked out in this one place: the blocks, the ONNX
contract and traces, the cache graphs, ONNX Runtime GenAI's config, the cost model, the
parameter arithmetic and the manifest that other runtimes read all take them from here, so a
card that sets its key/value heads or its head size apart changes this file only (litgpt
derives `head_size` and `n_query_groups` once in the same way). No torch."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

# One key or value tensor; the names are the graphs' own (Optimum's).
CACHE_AXES = ("batch_size", "kv_heads", "past_sequence_length", "head_dim")
CROSS_CACHE_AXES = ("batch_size", "kv_heads", "encoder_sequence_length", "head_dim")


@dataclass(frozen=True)
class AttentionSizes:
    d_model: int
    heads: int  # query heads
    kv_heads: int  # key/value heads: the cache's (heads, until a card sets them apart)
    head_dim: int

    @property
    def query_width(self) -> int:
        return self.heads * self.head_dim

    @property
    def kv_width(self) -> int:
        return self.kv_heads * self.head_dim

    def as_dict(self) -> dict[str, int]:
        return {"heads": self.heads, "kv_heads": self.kv_heads, "head_dim": self.head_dim}


def attention_sizes(card: Any) -> AttentionSizes:
    """`card`: a Card or its fields, validated. Key/value heads are `n_kv_heads` (grouped-query
    attention: each serves n_heads / n_kv_heads query heads), else n_heads; the head size is
    `head_dim` where a card sets it (Qwen3, Gemma), else d_model / n_heads."""
    d_model, heads = card["d_model"], card["n_heads"]
    return AttentionSizes(d_model, heads, _field(card, "n_kv_heads") or heads,
                          _field(card, "head_dim") or d_model // heads)


def _field(card: Any, name: str) -> Any:
    """A field that older cards (and a bare {d_model, n_heads}) may not have."""
    try:
        return card[name]
    except KeyError:
        return None


def cache_shape(card: Any, batch: int, length: int) -> tuple[int, int, int, int]:
    """One cache tensor: (batch, kv_heads, length, head_dim)."""
    sizes = attention_sizes(card)
    return batch, sizes.kv_heads, length, sizes.head_dim


def cache_entry(card: Any) -> dict[str, Any]:
    """What the manifest records of the cache, so a runtime in any language reads the shape of
    an empty past instead of working it out from the card."""
    sizes = attention_sizes(card)
    static = {"kv_heads": sizes.kv_heads, "head_dim": sizes.head_dim}
    return {**sizes.as_dict(),
            "shape": [static.get(axis, axis) for axis in CACHE_AXES]}
