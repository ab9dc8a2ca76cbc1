"""Parameter counts by arithmetic on a resolved card, so `zoo list` and `zoo show` need no torch.

The tests check these numbers against the real modules (built on the meta device for full-size
cards), and against the published counts of GPT-2 small and BERT-base.
"""

from __future__ import annotations

from typing import Any

import registry.dual as dual
import registry.experts as experts
import registry.stems as stems
from registry.blocks import BLOCKS, effective_bias, key_bias
from registry.families import SPECS
from registry.schema import shared_embeddings, target_vocab_size
from registry.sizes import attention_sizes


class UnknownCount(Exception):
    """A plugin block did not declare how many parameters it holds."""


def block_params(kind: str, card: dict[str, Any]) -> int:
    """What the card's block of `kind` holds, as its declaration counts (registry/blocks.py, or
    the plugin's `param_count`)."""
    entry = BLOCKS[kind][card[kind]]
    if entry.param_count is None:
        raise UnknownCount(entry.name)
    return int(entry.param_count(card))


def norm_params(card: dict[str, Any]) -> int:
    return block_params("norm", card)


def ffn_params(card: dict[str, Any]) -> int:
    """A layer's feed-forward (a mixture's dense layer; its sparse ones: count_parameters)."""
    return block_params("activation", card)


def attention_params(card: dict[str, Any]) -> int:
    """Query and output projections at the query width, key and value at the key/value width."""
    d, sizes = card["d_model"], attention_sizes(card)
    weights = 2 * d * sizes.query_width + 2 * d * sizes.kv_width
    qkv_bias = effective_bias(card, "attention_bias")
    projections = sizes.query_width + sizes.kv_width if qkv_bias else 0
    projections += sizes.kv_width if key_bias(card) else 0
    qk_norms = 2 * norm_params({**card, "d_model": sizes.head_dim}) if card.get("qk_norm") else 0
    if card.get("qk_norm") and card.get("qk_norm_scope") == "projection":  # OLMoE's
        qk_norms = (norm_params({**card, "d_model": sizes.query_width})
                    + norm_params({**card, "d_model": sizes.kv_width}))
    return weights + projections + (d if card["bias"] else 0) + qk_norms


def position_params(card: dict[str, Any]) -> int:
    return block_params("position", card)


def count_parameters(card: dict[str, Any]) -> dict[str, int]:
    """Parameters per part (each tensor counted once, tied weights included once)."""
    d, vocab, n = card["d_model"], card["vocab_size"], card["n_layers"]
    family = card["family"]
    if family == dual.DUAL:  # two towers, each counted as the card it is
        return dual.dual_params(card, count_parameters, norm_params)
    norm = norm_params(card)
    encoder_layer = attention_params(card) + ffn_params(card) + 2 * norm
    if card.get("sandwich_norm"):  # a norm after attention and after the feed-forward too
        encoder_layer += 2 * norm
    parts: dict[str, int] = {}

    # the patch stem holds its own positions; the token stem's are the position block's
    embeddings = block_params("stem", card) + (
        0 if stems.is_patch_card(card) else position_params(card))
    if card.get("stem_norm"):  # CLIP's pre_layrnorm after the patches
        embeddings += norm
    if stems.is_mel_card(card):  # the decoder's tokens, beside the audio stem
        embeddings += vocab * d
    if card["embedding_norm"]:
        embeddings += norm
    target = target_vocab_size(card)
    if family == "encoder-decoder" and not shared_embeddings(card):
        embeddings += target * d  # a separate target embedding
    parts["embeddings"] = embeddings

    first = 0 if card.get("first_attention_norm", True) else norm  # ModernBERT's layer 0: none
    if family == "encoder":
        parts["encoder layers"] = n * encoder_layer - first
    elif family == "decoder":
        parts["decoder layers"] = n * encoder_layer - first  # causal self-attention + FFN
    else:
        parts["encoder layers"] = n * encoder_layer - first
        parts["decoder layers"] = n * (encoder_layer + attention_params(card) + norm) - first
    if card["activation"] == experts.NAME:  # dense and sparse layers (registry/experts.py)
        bias = effective_bias(card, "mlp_bias")
        parts["decoder layers"] += (experts.moe_feed_forward_params(card, ffn_params(card), bias)
                                    - n * ffn_params(card))
    stacks = len(SPECS[family].stacks)
    parts["final norm"] = stacks * norm if card["final_norm"] else 0

    heads = 0
    if card["pooler"]:
        heads += d * d + d
    if card["mlm_head"]:
        heads += d * d + d + norm + vocab  # transform, norm, output bias
        heads -= 0 if card.get("head_bias", True) else d
    if card["num_labels"]:
        heads += d * card["num_labels"] + card["num_labels"]  # the classifier's linear
    if card["num_labels"] and card.get("classifier_transform"):  # ModernBERT's dense and norm
        heads += d * d + (d if card.get("head_bias", True) else 0) + norm
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


def active_parameters(card: dict[str, Any]) -> int | None:
    """Parameters one token uses: the total less the experts it is not routed to (a
    mixture-of-experts card's "active" count; the total for any other card)."""
    total = total_parameters(card)
    if total is None or card["activation"] != experts.NAME:
        return total
    return total - experts.inactive_params(card, effective_bias(card, "mlp_bias"))
