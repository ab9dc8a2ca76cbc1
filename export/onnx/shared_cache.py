"""A second decoder graph for generation, whose key/value cache is updated in place.

The contract graph (`model.onnx`) takes the cache as `(B, H, past, D)` and returns it grown by
the new tokens: ONNX Runtime concatenates, so every step reads and writes the whole cache again
and per-token time grows with the past. This graph takes fixed buffers `(B, H, capacity, D)`
instead and runs ONNX Runtime's GroupQueryAttention on them; when the caller binds each
`present.*` output to the same OrtValue as its `past_key_values.*` input, the kernel writes only
the new tokens' keys and values and attends to each row's first `seqlens_k + 1` positions.

Rows are right-aligned in the buffer (row b holds its tokens at 0..length_b - 1), so a
left-padded prompt is compacted before prefill; position ids still count real tokens, so every
row computes what it computes in the contract graph. Only the last real token's logits are
computed (`logits` is `(B, vocab)`), which saves the vocabulary projection for every other
prompt token.

The graph is exported from the same modules as `model.onnx`: only each self-attention's core is
swapped (Attention's public seam, zoo/blocks/attention.py) for GroupQueryAttention, emitted
through `torch.onnx.ops.symbolic_multi_out`, so cards with other norms, positions and
feed-forwards, plugins included, get it too.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable

import torch
from torch import nn
from torch.export import Dim

from export.onnx.wrappers import flatten, pair_up
from registry.catalog import Card
from registry.sizes import cache_shape
from runtime.contract import CACHE_INPUT, CACHE_OUTPUT, past_names
from zoo.blocks.attention import Attention, KeyValue, attention_core
from zoo.blocks.heads import LMHead
from zoo.blocks.positions import Rotary, apply_rotary

KV_FILE = "onnx/model_kv.onnx"
KV_INPUTS = ["input_ids", "position_ids", "seqlens_k", "total_sequence_length"]
# >= 2 everywhere: torch.export specialises sizes 0 and 1 (docs/architecture.md, traps)
TRACE_BATCH, TRACE_SEQUENCE, TRACE_CAPACITY = 2, 3, 8


def kv_names(n_layers: int) -> tuple[list[str], list[str]]:
    return ([*KV_INPUTS, *past_names(n_layers, CACHE_INPUT)],
            [LMHead.graph_output, *past_names(n_layers, CACHE_OUTPUT)])


class GroupQueryAttentionCore:
    """An attention core (zoo.blocks.attention.AttentionCore) that runs GroupQueryAttention on
    the module's own projections (its query and key/value heads, default scale 1/sqrt(head_dim),
    causal within the new tokens). Its `mask` is (seqlens_k, total_sequence_length,
    position_ids), passed through unchanged by the layer; its `past` and present are the
    in-place buffers.

    With `tables` (cos and sin of every position's angles, (max_positions, head_dim / 2)) the
    kernel rotates queries and keys itself (do_rotary): about twenty nodes a layer fewer (the
    split into heads, the half-rotation and the merge). ONNX Runtime 1.31's CPU kernel ignores
    its position_ids input (measured) and rotates at the positions seqlens_k implies: 0.. for a
    first prompt, the row's length after it. Those are exactly the positions the shared-cache
    loop feeds (rows compacted to the buffer's start) and GenAI's loop feeds (right-padded, from
    0); position_ids is passed for a kernel that reads it. The export's check of this loop
    against the plain one proves it on a left-padded batch.

    A local layer's core has the card's `window` (zoo/blocks/windows.py), which is the kernel's
    local_window_size: ONNX Runtime 1.31's CPU kernel lets a query see that many keys, itself
    included (measured on one node against numpy; its source of other versions reads it as the
    keys before the query, one more), as a causal sliding_window does; the export's check of
    the shared-cache loop, on a prompt past the window, holds it to that. Its tables are the
    local layers' own rotary base. An attention's own query scale (Gemma's
    query_pre_attn_scalar) and score cap (Gemma 2's softcap) are the kernel's `scale` and
    `softcap` attributes, which it applies as the eager core does: scale, cap, then the mask."""

    def __init__(self, tables: Rotary | None = None, window: int | None = None) -> None:
        self.tables = tables
        self.window = window

    def __call__(self, attention: Attention, x: torch.Tensor, source: torch.Tensor,
                 mask: tuple[torch.Tensor, torch.Tensor, torch.Tensor], past: KeyValue,
                 rotary: Rotary | None) -> tuple[torch.Tensor, KeyValue]:
        a = attention
        query, key, value = a.query(x), a.key(x), a.value(x)
        if a.query_norm is not None and a.key_norm is not None:  # qk-norm: before rotary
            query = _per_head(a, query, a.n_heads, a.query_norm)
            key = _per_head(a, key, a.kv_heads, a.key_norm)
        seqlens_k, total, position_ids = mask
        attributes: dict[str, int | float] = {"num_heads": a.n_heads,
                                              "kv_num_heads": a.kv_heads}
        if a.scale != 1.0 / math.sqrt(a.head_dim):  # the kernel's default otherwise
            attributes["scale"] = a.scale
        if a.softcap is not None:
            attributes["softcap"] = a.softcap
        if self.window is not None:
            attributes["local_window_size"] = self.window
        rotation: list[torch.Tensor] = []
        if rotary is not None and self.tables is not None:  # the kernel rotates
            rotation, attributes["do_rotary"] = [*self.tables, position_ids], 1
        elif rotary is not None:
            rotate = lambda heads: apply_rotary(heads, rotary)  # noqa: E731
            query = _per_head(a, query, a.n_heads, rotate)
            key = _per_head(a, key, a.kv_heads, rotate)
        inputs = (query, key, value, past[0], past[1], seqlens_k, total, *rotation)
        output, present_key, present_value = torch.onnx.ops.symbolic_multi_out(
            "com.microsoft::GroupQueryAttention", inputs, attributes,
            dtypes=(query.dtype, query.dtype, query.dtype),
            shapes=(query.shape, past[0].shape, past[1].shape),
            version=1,
        )
        return output, (present_key, present_value)


def _per_head(attention: Attention, x: torch.Tensor, heads: int,
              change: Callable[[torch.Tensor], torch.Tensor]) -> torch.Tensor:
    """GroupQueryAttention takes (B, T, heads * hd): apply `change` (rotary, the qk-norm) to
    each head (B, heads, T, hd), then merge the heads again."""
    batch, length, _ = x.shape
    return change(attention.split_heads(x, heads)).transpose(1, 2).reshape(
        batch, length, -1)


class SharedCacheDecoderGraph(nn.Module):
    """(input_ids, position_ids, seqlens_k, total_sequence_length, *buffers) ->
    (logits of each row's last real token, *buffers)."""

    def __init__(self, model: nn.Module, rotary_in_kernel: bool = True) -> None:
        super().__init__()
        self.model = model
        self.rotary_in_kernel = rotary_in_kernel

    def forward(self, input_ids, position_ids, seqlens_k, total_sequence_length, past):  # noqa: ANN001
        m = self.model
        x = m.embeddings(input_ids, position_ids)
        rotary = m.embeddings.position.rotary(position_ids)
        # the local layers' own table, for a core that rotates before the kernel (one that
        # rotates in it holds each kind's cos and sin caches and reads `rotary` as a flag)
        local = getattr(m, "local_attention", None)
        own = local is not None and local.rotary is not None and not self.rotary_in_kernel
        rotaries = {False: rotary, True: local.rotary.rotary(position_ids) if own else rotary}
        lengths = (seqlens_k, total_sequence_length, position_ids)
        presents = []
        for layer, cache in zip(m.layers, pair_up(past), strict=True):
            x, present = layer(x, lengths, past=cache, rotary=rotaries[layer.local])
            presents.append(present)
        # Row b's last real token: seqlens_k[b] in a first (compacted) prompt, the last column
        # in a decoding step; both are min(seqlens_k, T - 1).
        last = seqlens_k.long().clamp(max=input_ids.shape[1] - 1)
        x = x[torch.arange(x.shape[0]), last][:, None]
        if m.final_norm is not None:
            x = m.final_norm(x)
        return (m.head(x, m.embeddings.token.weight)[:, 0], *flatten(presents))


def shared_cache_attention(model: nn.Module, card: Card, rotary_in_kernel: bool = True
                           ) -> contextlib.AbstractContextManager:
    """Every decoder layer's self-attention on GroupQueryAttention, for the export only; local
    layers' with their window and rotary tables. `rotary_in_kernel` False (a head size the
    kernel's rotary refuses: export/onnx/gqa_rules.py): queries and keys rotated before it."""
    global_tables = rotary_tables(model, card) if rotary_in_kernel else None
    local = getattr(model, "local_attention", None)
    stack = contextlib.ExitStack()
    stack.enter_context(attention_core(
        (layer.self_attention for layer in model.layers if not layer.local),
        GroupQueryAttentionCore(global_tables)))
    if local is not None:
        local_tables = (global_tables if local.rotary is None or not rotary_in_kernel
                        else position_tables(local.rotary, card["max_positions"]))
        stack.enter_context(attention_core(
            (layer.self_attention for layer in model.layers if layer.local),
            GroupQueryAttentionCore(local_tables, local.window)))
    return stack


def rotary_tables(model: nn.Module, card: Card) -> Rotary | None:
    """(cos, sin) of every position's rotary angles, as GroupQueryAttention's cos_cache and
    sin_cache, for a card with rotary positions (its frequencies as scaled); else None."""
    if getattr(model.embeddings.position, "inv_freq", None) is None:
        return None
    return position_tables(model.embeddings.position, card["max_positions"])


def position_tables(position: nn.Module, max_positions: int) -> Rotary:
    """(cos, sin) of a rotary block's angles at positions 0 .. max_positions - 1."""
    angles = torch.arange(max_positions, dtype=torch.float32)[:, None] * position.inv_freq
    scale = position.attention_scale  # YaRN's; 1 otherwise
    return angles.cos() * scale, angles.sin() * scale


def kv_trace(model: nn.Module, card: Card, rotary_in_kernel: bool = True
             ) -> tuple[nn.Module, tuple, tuple]:
    """(graph module, example args, dynamic shapes) for torch.onnx.export."""
    b, t, capacity = TRACE_BATCH, TRACE_SEQUENCE, TRACE_CAPACITY
    cache = tuple(torch.zeros(cache_shape(card, b, capacity)) for _ in range(2 * card["n_layers"]))
    args = (torch.randint(3, card["vocab_size"], (b, t)), torch.arange(t).expand(b, t).contiguous(),
            torch.tensor([t - 1, t - 2], dtype=torch.int32), torch.tensor(t, dtype=torch.int32),
            cache)
    batch, sequence, slots = Dim("batch_size"), Dim("sequence_length"), Dim("capacity")
    shapes = ({0: batch, 1: sequence}, {0: batch, 1: sequence}, {0: batch}, None,
              tuple({0: batch, 2: slots} for _ in cache))
    return SharedCacheDecoderGraph(model, rotary_in_kernel), args, shapes
