"""The parity grid's cases, per family: shapes that differ from the traced ones.

Batch 1 and 3; sequence 1, a middle length and the longest (`longest`: the card's maximum, up to
LONGEST and a budget for large models); past length 0 and > 0; rows with padding. Any cache and
encoder memory a case needs is computed by the reference engine.
"""

from __future__ import annotations

import math

import numpy as np

from export.family import Case
from registry.catalog import Card
from registry.params import total_parameters
from registry.schema import target_vocab_size
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
from zoo.blocks.windows import has_local_layers

LONGEST = 1024  # the grid's longest sequence: eager attention over 8k-32k positions (Llama,
# Qwen) would need tens of GB for one (B, H, T, T) score tensor; 1024 is GPT-2's whole context
# The eager PyTorch reference dominates the check's time, about parameters x tokens: a grid at
# 1,024 took SmolLM2-135M's export 3.7 of its 6 minutes and 12 GB. Above this budget the longest
# case is shortened (a power of two, at least SHORTEST): 256 for the ~130M-parameter models.
TOKEN_BUDGET = 48 * 10**9  # parameters x tokens of the longest case
SHORTEST = 128
# Float32 logits a window case may produce at once: gemma-3-1b's 262,144-token vocabulary over
# two rows of 514 positions is 1 GB, held by PyTorch and by ONNX Runtime at once, beside both
# copies of the weights. Past this the window cases run one unpadded row (a padded one's real
# tokens would not reach past the window), and the prompt past the window arrives in two halves.
LOGITS_BUDGET = 1 << 27


def longest(card: Card) -> int:
    """The longest sequence the grid runs: max_positions, up to LONGEST, and up to what
    TOKEN_BUDGET allows a model of this size."""
    limit = min(card["max_positions"], LONGEST)
    parameters = total_parameters(card.fields)  # None when a plugin block does not say
    if parameters:
        affordable = max(SHORTEST, 2 ** int(math.log2(TOKEN_BUDGET / parameters)))
        limit = min(limit, affordable)
    return limit


def lengths(limit: int) -> tuple[int, int]:
    """A middle sequence length and a past length that fit within `limit` together."""
    return max(2, limit // 2), max(1, limit // 3)


def random_ids(engine: Engine, rng: np.random.Generator, batch: int, length: int,
               vocab: int | None = None) -> np.ndarray:
    return rng.integers(3, vocab or engine.card["vocab_size"], (batch, length), dtype=np.int64)


def mel_frames(rng: np.random.Generator, card: Card, batch: int, length: int) -> np.ndarray:
    """Log-mel-like frames for a speech card: about unit scale, as Whisper's features are."""
    return rng.standard_normal((batch, card["n_mels"], length)).astype(np.float32)


def left_padding(batch: int, length: int) -> np.ndarray:
    """Row r has r * length // 4 leading pads; row 0 none."""
    mask = np.ones((batch, length), np.int64)
    for row in range(batch):
        mask[row, : row * length // 4] = 0
    return mask


def local_window(card: Card) -> int | None:
    """The sliding window of a card with local layers (zoo/blocks/windows.py), else None."""
    return card["sliding_window"] if has_local_layers(card) else None


def window_shapes(card: Card) -> list[tuple[int, int, int, bool]]:
    """(batch, length, past, padded) past a local layer's window, wherever the longest case
    stops short of it: a padded prompt longer than the window, and steps whose past fills it
    (the first keys leave the window). Beyond the token budget: they are what local layers
    need, and a wrong window is otherwise invisible. Two rows, or past LOGITS_BUDGET one
    unpadded row and the long prompt in two chunks (half its logits at once)."""
    window = local_window(card)
    if window is None or window + 2 > card["max_positions"]:
        return []
    if 2 * (window + 2) * card["vocab_size"] <= LOGITS_BUDGET:
        return [(2, window + 2, 0, True), (2, 2, window, True), (1, 1, window + 1, False)]
    # the second half's first keys still leave the window as its queries advance
    half = (window + 2) // 2
    return [(1, window + 2 - half, half, False), (1, 2, window, False),
            (1, 1, window + 1, False)]


def decoder_cases(engine: Engine, rng: np.random.Generator) -> list[Case]:
    card = engine.card
    limit = longest(card)
    middle, past = lengths(limit)
    inputs = past_names(card["n_layers"], CACHE_INPUT)
    outputs = past_names(card["n_layers"], CACHE_OUTPUT)
    cases = []
    for batch, length, past_length, padded in (
        (1, 1, 0, False), (3, middle, 0, False), (1, limit, 0, False), (3, middle, 0, True),
        (1, 1, past, False), (3, 1, past, True), (3, limit - past, past, True),
        *window_shapes(card),
    ):
        total = past_length + length
        mask = left_padding(batch, total) if padded else np.ones((batch, total), np.int64)
        positions = np.clip(np.cumsum(mask, axis=1) - 1, 0, None)
        cache = empty_past(engine, batch)
        if past_length:  # a real cache: the reference run over a prefix
            prefix = engine.run(MODEL_GRAPH, {
                "input_ids": random_ids(engine, rng, batch, past_length),
                "attention_mask": mask[:, :past_length], "position_ids": positions[:, :past_length],
                **dict(zip(inputs, cache, strict=True))})
            cache = [prefix[name] for name in outputs]
            del prefix  # its logits, before the next case's prefix is run
        name = f"b{batch} s{length} past{past_length}" + (" padded" if padded else "")
        cases.append(Case(name, MODEL_GRAPH, {
            "input_ids": random_ids(engine, rng, batch, length), "attention_mask": mask,
            "position_ids": positions[:, past_length:], **dict(zip(inputs, cache, strict=True))}))
    return cases


def right_padding(batch: int, length: int) -> np.ndarray:
    mask = np.ones((batch, length), np.int64)
    for row in range(1, batch):
        mask[row, length - row * length // 4:] = 0
    return mask


def encoder_cases(engine: Engine, rng: np.random.Generator, file: str,
                  with_token_types: bool) -> list[Case]:
    limit = longest(engine.card)
    middle, _ = lengths(limit)
    cases = []
    shapes = [(1, 1, False), (3, middle, False), (1, limit, False), (3, middle, True)]
    if engine.card["pooling"] is not None:  # a sentence vector must ignore padding on either side
        shapes.append((3, middle, "left"))
    window = engine.card["sliding_window"]
    if window is not None and has_local_layers(engine.card):  # padded rows that really slide
        shapes.append((3, min(limit, 2 * window + 3), True))
    for batch, length, padded in shapes:
        pad = left_padding if padded == "left" else right_padding
        mask = pad(batch, length) if padded else np.ones((batch, length), np.int64)
        ids = random_ids(engine, rng, batch, length)
        if with_token_types and engine.card["type_vocab_size"]:
            types = rng.integers(0, engine.card["type_vocab_size"], (batch, length),
                                 dtype=np.int64)
            feeds = encoder_feeds(engine.card, ids, mask, types)
        else:
            feeds = {"input_ids": ids, "attention_mask": mask}
        name = f"b{batch} s{length}" + {False: "", True: " padded", "left": " left-padded"}[padded]
        cases.append(Case(name, file, feeds))
    return cases


def seq2seq_decoder_cases(engine: Engine, rng: np.random.Generator) -> list[Case]:
    card = engine.card
    limit = longest(card)
    middle, past = lengths(limit)
    inputs = past_names(card["n_layers"], CACHE_INPUT, DECODER)
    outputs = past_names(card["n_layers"], CACHE_OUTPUT, DECODER)
    cross_in = past_names(card["n_layers"], CACHE_INPUT, ENCODER)
    cross_out = past_names(card["n_layers"], CACHE_OUTPUT, ENCODER)
    target = target_vocab_size(card)
    cases = []
    for batch, length, past_length, padded in (
        (1, 1, 0, False), (3, middle, 0, True), (1, limit, 0, False), (3, 1, past, True),
        (1, limit - past, past, False),
    ):
        source_mask = right_padding(batch, middle) if padded else np.ones((batch, middle),
                                                                           np.int64)
        encoded = engine.run("encoder.onnx", {"input_ids": random_ids(engine, rng, batch, middle),
                                              "attention_mask": source_mask})
        shared = {"encoder_attention_mask": source_mask,
                  **{name: encoded[out] for name, out in zip(cross_in, cross_out, strict=True)}}
        cache = empty_past(engine, batch)
        if past_length:
            prefix = engine.run("decoder.onnx", {
                "input_ids": random_ids(engine, rng, batch, past_length, target), **shared,
                **dict(zip(inputs, cache, strict=True))})
            cache = [prefix[name] for name in outputs]
        name = f"b{batch} s{length} past{past_length}" + (" src-padded" if padded else "")
        cases.append(Case(name, "decoder.onnx", {
            "input_ids": random_ids(engine, rng, batch, length, target), **shared,
            **dict(zip(inputs, cache, strict=True))}))
    return cases
