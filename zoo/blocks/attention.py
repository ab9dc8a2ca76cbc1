"""One multi-head attention module for self, causal self and cross attention.

The key/value cache is explicit: tensors in, tensors out, no hidden state, so the code path that
runs eagerly is the one that is traced for export. Cache tensors are (B, n_heads, S, head_dim).
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any, Protocol

import torch
import torch.nn.functional as F
from torch import nn

from registry.blocks import effective_bias, key_bias
from registry.sizes import attention_sizes
from zoo.blocks.classes import build_block
from zoo.blocks.norms import ProjectionNorm
from zoo.blocks.positions import Rotary, apply_rotary

KeyValue = tuple[torch.Tensor, torch.Tensor]


def build_mask(
    key_padding: torch.Tensor | None, query_length: int, key_length: int, causal: bool,
    device: torch.device | None = None, dtype: torch.dtype = torch.float32,
    window: int | None = None,
) -> torch.Tensor | None:
    """Additive mask (B|1, 1, T, S): 0 where a query may attend a key, the dtype's lowest
    value where it may not. Built once per forward and added to every layer's scores: one Add
    per layer in the graph, where a boolean mask cost a Where (select) per layer.

    `key_padding` is (B, S) with 1 for real tokens. With `causal`, the T queries are the last T of
    the S positions (the first S - T are the cache), so query i sees keys j <= S - T + i.
    A large finite value, not -inf: a row with every key masked (a padding query) becomes
    uniform instead of NaN. At least float32 (the scores are added to it in float32), so a
    float16 model's padding rows are uniform too, not overflowed to -inf.

    `window` (a local layer's, zoo/blocks/windows.py): causal, query i sees keys j with
    i - window < j <= i; otherwise keys with |i - j| <= window // 2. Padding is contiguous at
    one end, so distances between real tokens are distances between their indices.
    """
    allowed = None
    if causal or window is not None:
        query_positions = torch.arange(query_length, device=device) + (key_length - query_length)
        key_positions = torch.arange(key_length, device=device)
    if causal:
        allowed = (key_positions[None, :] <= query_positions[:, None])[None, None]  # (1,1,T,S)
    if window is not None:
        distance = query_positions[:, None] - key_positions[None, :]
        near = distance < window if causal else distance.abs() <= window // 2
        allowed = near[None, None] if allowed is None else allowed & near[None, None]
    if key_padding is not None:
        padding = key_padding.bool()[:, None, None, :]  # (B, 1, 1, S)
        allowed = padding if allowed is None else allowed & padding
    if allowed is None:
        return None
    dtype = torch.promote_types(dtype, torch.float32)  # a float16 model's mask too
    zero = torch.zeros((), dtype=dtype, device=device)
    return zero.masked_fill(~allowed, torch.finfo(dtype).min)


def with_position_bias(position: nn.Module, mask: torch.Tensor | None, query_length: int,
                       key_length: int) -> torch.Tensor | None:
    """The self-attention mask with the position block's bias on the scores, where it has one
    (`attention_bias`, e.g. ALiBi's): still one Add per layer. Positions without it (every
    built-in one) leave the mask, and so the graph, as it was."""
    bias_of = getattr(position, "attention_bias", None)
    bias = None if bias_of is None else bias_of(query_length, key_length)
    if bias is None:
        return mask
    return bias if mask is None else mask + bias


def padded_positions(input_ids: torch.Tensor, attention_mask: torch.Tensor | None,
                     start: int | torch.Tensor = 0) -> torch.Tensor:
    """Position ids (B, T) that count real tokens only, so a row padded on either side numbers
    its tokens exactly as it would alone; without a mask, start, start + 1, ..."""
    batch, length = input_ids.shape
    if attention_mask is None:
        return (torch.arange(length, device=input_ids.device) + start).expand(batch, length)
    return (attention_mask.long().cumsum(dim=1) - 1).clamp(min=0)


class AttentionCore(Protocol):
    """What an Attention computes from its own projections: the seam for other kernels.

    Called with the module (its `query`/`key`/`value` projections, `split_heads`, `n_heads`,
    `dropout`), the queries' input x (B, T, d), the keys' source (x itself; None for
    cross-attention, whose keys and values come whole in `past`, projected once per source),
    the mask, the cache and the rotary tables. Returns the attended values merged back to
    (B, T, d), before the output projection, and the cache to hand back.
    """

    def __call__(self, attention: Attention, x: torch.Tensor, source: torch.Tensor | None,
                 mask: Any, past: Any, rotary: Rotary | None) -> tuple[torch.Tensor, Any]: ...


class DotProductCore:
    """softmax((Q / sqrt(head_dim)) K^T + mask) V, with the cache appended by concatenation
    (the module's own `scale` for 1 / sqrt(head_dim) where it has one, and its `softcap` on the
    scores before the mask: Gemma's).
    Given a `record` list, it also appends each call's probabilities (B, nh, T, S) to it.

    The scale multiplies Q, which feeds the MatMul directly: ONNX Runtime folds a scalar Mul on
    a MatMul input into the kernel (FusedMatMul's alpha) when it loads the graph, so it costs
    nothing, where a Div of the (B, nh, T, S) scores stayed a kernel of its own.

    Cross-attention scales the query's projection instead, x (W s) + b s (constants that ONNX
    Runtime folds when it loads the graph): a decoding step's scores are then a product with
    alpha 1, which MLAS runs with its one-row kernel reading
    the cross keys where they lie; with alpha 1/sqrt(head_dim) it packs (copies) every head's
    keys first, every step, the cost of a step that grew with the source (BENCHMARKS.md)."""

    def __init__(self, record: list[torch.Tensor] | None = None) -> None:
        self.record = record

    def __call__(self, attention: Attention, x: torch.Tensor, source: torch.Tensor | None,
                 mask: torch.Tensor | None, past: KeyValue | None, rotary: Rotary | None
                 ) -> tuple[torch.Tensor, KeyValue]:
        a = attention
        scale = a.scale
        if scale == 1.0 and source is None and a.query_norm is None:  # T5: nothing to scale
            query = a.split_heads(a.query(x))
        elif source is None and a.query_norm is None and type(a.query) is nn.Linear:
            # cross-attention: scaled in the projection (a LoRA adapter's query: below)
            bias = None if a.query.bias is None else a.query.bias * scale
            query = a.split_heads(F.linear(x, a.query.weight * scale, bias))
        else:
            query = a.split_heads(a.query(x))
            if a.query_norm is not None:
                query = a.query_norm(query)
            if scale != 1.0:  # T5: unscaled
                query = query * scale
        if source is None:  # cross-attention: the source's keys and values, projected once
            assert past is not None
            key, value = past
        else:
            key, value = a.project(source)
            if rotary is not None:
                query, key = apply_rotary(query, rotary), apply_rotary(key, rotary)
            if past is not None:
                key = torch.cat([past[0], key], dim=2)
                value = torch.cat([past[1], value], dim=2)
        attended_key, attended_value = a.shared(key), a.shared(value)
        scores = query @ attended_key.transpose(-2, -1)  # (B, nh, T, S)
        if a.softcap is not None:  # Gemma 2's cap on the scores, before the mask
            scores = torch.tanh(scores / a.softcap) * a.softcap
        scores = scores.float()  # the softmax in float32, as transformers' eager attention
        if mask is not None:
            scores = scores + mask
        probabilities = scores.softmax(dim=-1).to(query.dtype)
        if self.record is not None:
            self.record.append(probabilities)
        weights = a.dropout(probabilities)
        batch, _, length, _ = query.shape
        merged = (weights @ attended_value).transpose(1, 2).reshape(batch, length, -1)
        return merged, (key, value)  # the cache keeps the key/value heads, not their copies


DOT_PRODUCT = DotProductCore()


class Attention(nn.Module):
    """Projections around a replaceable core (`self.core`, see AttentionCore); the output
    projection is applied to whatever the core returns."""

    reads = ("d_model", "n_heads", "n_kv_heads", "head_dim", "dropout", "bias",
             "attention_bias", "key_bias", "qk_norm", "norm", "norm_eps", "query_pre_attn_scalar",
             "attn_logit_softcapping", "qk_norm_scope", "query_scale")

    def __init__(self, d_model: int, n_heads: int, dropout: float, bias: bool,
                 kv_heads: int | None = None, head_dim: int | None = None,
                 projection_bias: bool | None = None,
                 head_norm: Callable[[int], nn.Module] | None = None,
                 scale: float | None = None, softcap: float | None = None,
                 key_bias: bool | None = None) -> None:
        """Sizes as registry/sizes.py derives them from a card (zoo/assemble.py passes them);
        `kv_heads` and `head_dim` default to what it derives from d_model and n_heads alone.
        `projection_bias`: the query/key/value biases (default `bias`, which the output
        projection has); `head_norm(head_dim)`: a norm over each head's queries and keys;
        `scale`: the queries' (default 1/sqrt(head_dim); T5's 1); `softcap`: scores capped as
        softcap * tanh(scores / softcap); `key_bias`: the key projection's bias (default the
        query's; Whisper's keys have none)."""
        super().__init__()
        derived = attention_sizes({"d_model": d_model, "n_heads": n_heads})
        self.n_heads = n_heads
        self.kv_heads = kv_heads or derived.kv_heads
        self.head_dim = head_dim or derived.head_dim
        query_width, kv_width = n_heads * self.head_dim, self.kv_heads * self.head_dim
        qkv_bias = bias if projection_bias is None else projection_bias
        self.query = nn.Linear(d_model, query_width, bias=qkv_bias)
        self.key = nn.Linear(d_model, kv_width, bias=qkv_bias if key_bias is None else key_bias)
        self.value = nn.Linear(d_model, kv_width, bias=qkv_bias)
        self.out = nn.Linear(query_width, d_model, bias=bias)
        self.query_norm = head_norm(self.head_dim) if head_norm is not None else None
        self.key_norm = head_norm(self.head_dim) if head_norm is not None else None
        self.dropout = nn.Dropout(dropout)
        self.core: AttentionCore = DOT_PRODUCT
        self.scale = 1.0 / math.sqrt(self.head_dim) if scale is None else scale
        self.softcap = softcap

    @classmethod
    def from_card(cls, card: Mapping[str, Any], layer: int | None) -> Attention:
        """Sizes from registry/sizes.py; with `qk_norm`, the card's norm over each head."""
        sizes = attention_sizes(card)
        head_norm = ((lambda size: build_block("norm", card, layer, size=size))
                     if card["qk_norm"] else None)
        scalar = card["query_pre_attn_scalar"]  # Gemma's query scale
        scale = None if scalar is None else scalar**-0.5
        scale = scale if card["query_scale"] else 1.0  # T5's scores are not scaled
        attention = cls(card["d_model"], sizes.heads, card["dropout"], card["bias"],
                        sizes.kv_heads, sizes.head_dim, effective_bias(card, "attention_bias"),
                        head_norm, scale, card["attn_logit_softcapping"], key_bias(card))
        if card["qk_norm"] and card.get("qk_norm_scope") == "projection":  # OLMoE's
            attention.query_norm = ProjectionNorm(
                build_block("norm", card, layer, size=sizes.query_width))
            attention.key_norm = ProjectionNorm(
                build_block("norm", card, layer, size=sizes.kv_width))
        return attention

    def split_heads(self, x: torch.Tensor, heads: int | None = None) -> torch.Tensor:
        """(B, T, heads * hd) -> (B, heads, T, hd); the query heads unless told."""
        batch, length, _ = x.shape
        return x.view(batch, length, heads or self.n_heads, self.head_dim).transpose(1, 2)

    def project(self, source: torch.Tensor) -> KeyValue:
        """Keys and values of `source` (B, S, d), each (B, kv_heads, S, hd): for
        cross-attention this is the cache computed once per source."""
        key = self.split_heads(self.key(source), self.kv_heads)
        if self.key_norm is not None:
            key = self.key_norm(key)
        return key, self.split_heads(self.value(source), self.kv_heads)

    def shared(self, x: torch.Tensor) -> torch.Tensor:
        """Grouped-query attention: each key/value head (B, kv_heads, S, hd) repeated for the
        n_heads / kv_heads query heads of its group (B, n_heads, S, hd); as it is otherwise."""
        groups = self.n_heads // self.kv_heads
        if groups == 1:
            return x
        batch, heads, length, size = x.shape
        return x[:, :, None].expand(batch, heads, groups, length, size).reshape(
            batch, heads * groups, length, size)

    def forward(
        self,
        x: torch.Tensor,
        mask: Any = None,
        past: Any = None,
        rotary: Rotary | None = None,
        cross: bool = False,
    ) -> tuple[torch.Tensor, Any]:
        """Attend from x (B, T, d) to x itself plus `past` (self), or, with `cross`, to the
        keys and values in `past` alone (the source's, from `project`).

        Returns the output (B, T, d) and the keys/values attended to, which for self-attention
        are the cache to pass as `past` at the next step.
        """
        merged, present = self.core(self, x, None if cross else x, mask, past, rotary)
        return self.out(merged), present


@contextlib.contextmanager
def attention_core(attentions: Iterable[Attention], core: AttentionCore) -> Iterator[None]:
    """Run `attentions` with another core (e.g. for one export), then restore their own."""
    attentions = list(attentions)
    originals = [attention.core for attention in attentions]
    try:
        for attention in attentions:
            attention.core = core
        yield
    finally:
        for attention, original in zip(attentions, originals, strict=True):
            attention.core = original


@contextlib.contextmanager
def recorded_attentions(groups: dict[str, list[Attention]]
                        ) -> Iterator[dict[str, list[list[torch.Tensor]]]]:
    """Run with every attention in `groups` recording its probabilities: yields
    {group: [per module, the (B, nh, T, S) maps of each call]}, filled as the model runs.
    Outside the block the modules compute exactly as before, at no extra cost."""
    records: dict[str, list[list[torch.Tensor]]] = {
        name: [[] for _ in modules] for name, modules in groups.items()}
    modules = [module for group in groups.values() for module in group]
    originals = [module.core for module in modules]
    try:
        for name, group in groups.items():
            for module, record in zip(group, records[name], strict=True):
                module.core = DotProductCore(record)
        yield records
    finally:
        for module, original in zip(modules, originals, strict=True):
            module.core = original
