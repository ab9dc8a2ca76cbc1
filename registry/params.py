"""Parameter counts by arithmetic on a resolved card, so `zoo list` and `zoo show` need no torch.

The tests check these numbers against the real modules (built on the meta device for full-size
cards), and against the published counts of GPT-2 small and BERT-base.
"""

from __future__ import annotations

from typing import Any

from registry.blocks import BLOCKS
from registry.schema import effective_bias, shared_embeddings, target_vocab_size
from registry.sizes import attention_sizes


class UnknownCount(Exception):
    """A plugin block did not declare how many parameters it holds."""


def _plugin_count(kind: str, card: dict[str, Any]) -> int:
    entry = BLOCKS[kind][card[kind]]
    if entry.param_count is None:
        raise UnknownCount(entry.name)
    return int(entry.param_count(card))


def norm_params(card: dict[str, Any]) -> int:
    d = card["d_model"]
    return {"layernorm": 2 * d, "rmsnorm": d}.get(card["norm"]) or _plugin_count("norm", card)


GATED = ("swiglu", "geglu", "geglu_tanh")  # three matrices: gate, up, down


def ffn_params(card: dict[str, Any]) -> int:
    d, f, bias = card["d_model"], card["d_ff"], effective_bias(card, "mlp_bias")
    if card["activation"] in ("relu", "gelu", "gelu_tanh", "silu"):
        return 2 * d * f + (f + d if bias else 0)
    if card["activation"] in GATED:
        return 3 * d * f + (2 * f + d if bias else 0)
    return _plugin_count("activation", card)


def attention_params(card: dict[str, Any]) -> int:
    """Query and output projections at the query width, key and value at the key/value width."""
    d, sizes = card["d_model"], attention_sizes(card)
    weights = 2 * d * sizes.query_width + 2 * d * sizes.kv_width
    qkv_bias = effective_bias(card, "attention_bias")
    projections = sizes.query_width + 2 * sizes.kv_width if qkv_bias else 0
    qk_norms = 2 * norm_params({**card, "d_model": sizes.head_dim}) if card.get("qk_norm") else 0
    return weights + projections + (d if card["bias"] else 0) + qk_norms


def position_params(card: dict[str, Any]) -> int:
    name = card["position"]
    if name == "learned":
        return card["max_positions"] * card["d_model"]
    if name in ("sinusoidal", "sinusoidal_halves", "rotary"):
        return 0
    if name == "t5_relative":  # a table per stack (zoo/blocks/relative_bias.py)
        stacks = 2 if card["family"] == "encoder-decoder" else 1
        return stacks * card["relative_buckets"] * attention_sizes(card).heads
    return _plugin_count("position", card)


def count_parameters(card: dict[str, Any]) -> dict[str, int]:
    """Parameters per part (each tensor counted once, tied weights included once)."""
    d, vocab, n = card["d_model"], card["vocab_size"], card["n_layers"]
    family = card["family"]
    norm = norm_params(card)
    encoder_layer = attention_params(card) + ffn_params(card) + 2 * norm
    parts: dict[str, int] = {}

    embeddings = vocab * d + position_params(card) + card["type_vocab_size"] * d
    if card["embedding_norm"]:
        embeddings += norm
    target = target_vocab_size(card)
    if family == "encoder-decoder" and not shared_embeddings(card):
        embeddings += target * d  # a separate target embedding
    parts["embeddings"] = embeddings

    if family == "encoder":
        parts["encoder layers"] = n * encoder_layer
    elif family == "decoder":
        parts["decoder layers"] = n * encoder_layer  # causal self-attention + feed-forward
    else:
        parts["encoder layers"] = n * encoder_layer
        parts["decoder layers"] = n * (encoder_layer + attention_params(card) + norm)
    stacks = 2 if family == "encoder-decoder" else 1
    parts["final norm"] = stacks * norm if card["final_norm"] else 0

    heads = 0
    if card["pooler"]:
        heads += d * d + d
    if card["mlm_head"]:
        heads += d * d + d + norm + vocab  # transform, norm, output bias
    if card["num_labels"]:
        heads += d * card["num_labels"] + card["num_labels"]  # the classifier's linear
    # A decoder with a pooling is a sequence model: no LM head (zoo/assemble.py).
    has_output = (family == "encoder-decoder" or card["mlm_head"]
                  or (family == "decoder" and card["pooling"] is None))
    output_vocab = target if family == "encoder-decoder" else vocab
    if has_output and not card["tie_embeddings"]:
        heads += output_vocab * d  # an output matrix of its own
    if has_output and family != "encoder" and card["output_bias"]:
        heads += output_vocab
    parts["heads"] = heads
    return {name: count for name, count in parts.items() if count}


def total_parameters(card: dict[str, Any]) -> int | None:
    """The total, or None when a plugin block does not declare its count."""
    try:
        return sum(count_parameters(card).values())
    except UnknownCount:
        return None
