"""Attention maps of one sequence, per family, through any engine whose graphs output them
(export/torch_engine.TorchEngine(attentions=True), or ONNX Runtime on an `--attentions` export).

Each family runs its graphs once over the whole sequence with an empty cache, so a map shows
every query against every key: the decoder on prompt + generated tokens, the encoder on its
input, the encoder-decoder's encoder on the source and its decoder on the start token plus the
generated target (self-attention over the target, cross-attention onto the source).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

import registry.families as families
from export.family import attention_names
from runtime.contract import (
    CACHE_INPUT,
    CACHE_OUTPUT,
    DECODER,
    ENCODER,
    MODEL_GRAPH,
    past_names,
)
from runtime.decoding import empty_past
from runtime.encode import encoder_feeds
from runtime.engine import Engine


@dataclass
class AttentionGroup:
    """One group's maps (e.g. cross_attentions): (layers, heads, queries, keys) for one row."""

    name: str
    maps: np.ndarray
    queries: list[int]  # token ids along the query axis
    keys: list[int]  # token ids along the key axis


def _group(outputs: dict[str, np.ndarray], name: str, n_layers: int, queries: list[int],
           keys: list[int]) -> AttentionGroup:
    maps = np.stack([outputs[output][0] for output in attention_names((name,), n_layers)])
    return AttentionGroup(name, maps.astype(np.float64), queries, keys)


def _ones(ids: list[int]) -> np.ndarray:
    return np.ones((1, len(ids)), np.int64)


def decoder_maps(engine: Engine, prompt: list[int], generated: list[int]
                 ) -> list[AttentionGroup]:
    card = engine.card
    ids = [*prompt, *generated]
    feeds = {"input_ids": np.array([ids], np.int64), "attention_mask": _ones(ids),
             "position_ids": np.arange(len(ids), dtype=np.int64)[None],
             **dict(zip(past_names(card["n_layers"], CACHE_INPUT), empty_past(engine, 1),
                        strict=True))}
    outputs = engine.run(MODEL_GRAPH, feeds)
    return [_group(outputs, "attentions", card["n_layers"], ids, ids)]


def encoder_maps(engine: Engine, prompt: list[int], generated: list[int]
                 ) -> list[AttentionGroup]:
    card = engine.card
    outputs = engine.run(MODEL_GRAPH, encoder_feeds(card, np.array([prompt], np.int64)))
    return [_group(outputs, "attentions", card["n_layers"], prompt, prompt)]


def seq2seq_maps(engine: Engine, prompt: list[int], generated: list[int]
                 ) -> list[AttentionGroup]:
    card = engine.card
    n = card["n_layers"]
    source = np.array([prompt], np.int64)
    encoded = engine.run("encoder.onnx", {"input_ids": source, "attention_mask": _ones(prompt)})
    target = [card["bos_token_id"], *generated]
    cross = zip(past_names(n, CACHE_INPUT, ENCODER), past_names(n, CACHE_OUTPUT, ENCODER),
                strict=True)
    feeds = {"input_ids": np.array([target], np.int64), "encoder_attention_mask": _ones(prompt),
             **{name: encoded[output] for name, output in cross},
             **dict(zip(past_names(n, CACHE_INPUT, DECODER), empty_past(engine, 1),
                        strict=True))}
    decoded = engine.run("decoder.onnx", feeds)
    return [_group(encoded, "encoder_attentions", n, prompt, prompt),
            _group(decoded, "decoder_attentions", n, target, target),
            _group(decoded, "cross_attentions", n, target, prompt)]


# `zoo attention`'s maps per family, registered against the torch-free family spec (its kind)
Maps = Callable[[Engine, list[int], list[int]], list[AttentionGroup]]  # prompt, generated
MAPS: families.PerKind[Maps] = families.PerKind("zoo attention", {
    families.ENCODER.kind: encoder_maps, families.SEQUENCE.kind: encoder_maps,
    families.DECODER.kind: decoder_maps, families.ENCODER_DECODER.kind: seq2seq_maps})
maps_of, register_maps = MAPS.of, MAPS.register
