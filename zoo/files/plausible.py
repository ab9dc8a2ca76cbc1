"""Whether a checkpoint's config.json could describe its weights file, judged before the model
is built: a config asking for far more parameters than the file holds (`vocab_size: 10**15`, or
merely another model's config) is refused in one line, not by torch's allocator.

The check is one-sided on purpose: a file may hold more than the model (buffers such as GPT-2's
causal masks, tied copies, heads the zoo drops), never less, since every parameter is loaded.
And it leaves room: a file a few tensors short, or a width off by two, is better told by the
import's own list of missing and mis-shaped tensors, and a model at most ROOM times the file is
safe to build. The key blamed is the one the file's embedding tables contradict, else the one
that alone explains the gap.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from registry.blocks import GELU
from registry.catalog import open_catalog
from registry.errors import ZooError
from registry.layouts import LayoutMap
from registry.params import UnknownCount, attention_params, ffn_params, position_params

ROOM = 8  # refused when the config needs more than this many times the values the file holds
# Card fields the parameter count grows with, in the order a culprit is looked for.
SIZES = ("vocab_size", "max_positions", "n_layers", "d_model", "d_ff", "type_vocab_size")
# Fields the attention's size follows, read from config.json too: a map's defaults for them
# (Gemma's 256-wide heads) would otherwise count a tiny checkpoint's attention far too large.
HEADS = ("n_heads", "n_kv_heads", "head_dim")
# Zoo tensors whose shape in the file is card fields: (rows, columns).
TABLES = {"embeddings.token.weight": ("vocab_size", "d_model"),
          "source_embeddings.token.weight": ("vocab_size", "d_model"),
          "embeddings.position.table.weight": ("max_positions", "d_model")}


def _whole(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 1


def _implied_sizes(layout: LayoutMap, config: dict[str, Any]) -> tuple[dict[str, Any],
                                                                        dict[str, str]]:
    """(the parent card with config.json's sizes over it, {field: config.json key}). Values
    that are not whole numbers are left to the card's validation, which names them."""
    parent = open_catalog().get(layout.data["extends"])
    card = {**parent.fields, **layout["defaults"], **layout["fields"]}
    keys: dict[str, str] = {}
    for field in SIZES:
        found = layout.config_value(config, field)
        if found is not None and _whole(found[1]):
            keys[field], card[field] = found
    for field in HEADS:  # the attention's width, not blamed (the layers' count is)
        found = layout.config_value(config, field)
        if found is not None and _whole(found[1]):
            card[field] = found[1]
    ratio = layout.data.get("d_ff_per_d_model")
    if "d_ff" not in keys and ratio is not None:  # GPT-2's n_inner: null
        card["d_ff"] = ratio * card["d_model"]
    return card, keys


def _file_sizes(layout: LayoutMap, tensors: Mapping[str, torch.Tensor]
                ) -> dict[str, tuple[int, str]]:
    """{field: (size, the tensor that shows it)} read off the file's embedding tables."""
    shown: dict[str, tuple[int, str]] = {}
    for file_name, tensor in tensors.items():
        found = layout.match(layout.normalise(file_name)[0])
        if found is None or tensor.dim() != 2 or found[0].transforms != ["none"]:
            continue
        for field, size in zip(TABLES.get(found[0].targets[0], ()), tensor.shape, strict=False):
            shown[field] = int(size), f"{file_name} {tuple(tensor.shape)}"
    return shown


def _blamed(card: dict[str, Any], keys: dict[str, str], shown: dict[str, tuple[int, str]],
            held: int) -> tuple[list[str], str]:
    """(the fields to name, what shows them wrong): those the file's tables contradict, else
    the one among the rest that alone explains the gap, else every size config.json sets."""
    contradicted = [field for field in keys if field in shown and card[field] != shown[field][0]]
    if contradicted:
        tensors = dict.fromkeys(shown[field][1] for field in contradicted)
        return contradicted, f" ({', '.join(tensors)})"
    rest = [field for field in keys if field not in shown]
    alone = [field for field in rest if least_parameters({**card, field: 1}) <= ROOM * held]
    return alone[:1] or list(keys), ""


def least_parameters(card: dict[str, Any]) -> int:
    """A lower bound on the parameters of a model of `card`: the token (and token-type) table,
    learned positions, and per layer the attention and the smallest feed-forward, no biases,
    norms or heads (so no card the import might make from the same file counts fewer)."""
    lean = {**card, "bias": False, "attention_bias": False, "mlp_bias": False,
            "activation": GELU}  # 2*d*d_ff, the smallest kind
    try:
        positions = position_params(lean)
    except UnknownCount:  # a plugin's table: counted as none
        positions = 0
    layer = attention_params(lean) + ffn_params(lean)
    return (card["vocab_size"] + card["type_vocab_size"]) * card["d_model"] + positions \
        + card["n_layers"] * layer


def check_sizes(layout: LayoutMap, config: dict[str, Any], tensors: Mapping[str, torch.Tensor],
                config_where: str, weights_where: str) -> None:
    """Refuse a config.json whose sizes need more than ROOM times the values the weights file
    holds, naming the config.json keys to blame (_blamed)."""
    card, keys = _implied_sizes(layout, config)
    held = sum(tensor.numel() for tensor in tensors.values())
    needed = least_parameters(card)
    if needed <= ROOM * held:
        return
    named, evidence = _blamed(card, keys, _file_sizes(layout, tensors), held)
    shown = ", ".join(f"{keys[field]}={card[field]}" for field in named) or "the parent card"
    raise ZooError(f"{config_where}: {shown} disagrees with {weights_where}{evidence}: the "
                   f"sizes need at least {needed:,} parameters, the file holds {held:,} values")
