"""The plain generation sessions over the contract graphs, for any engine (PyTorch or ONNX
Runtime): they hold the cache and masks between steps.

`prefill` runs the prompt (or, for the encoder-decoder, encodes the source and feeds the start
token) and returns the next-token logits; `step` feeds one token per row; `expand` repeats
each row `beams` times and `reorder` keeps or duplicates rows within those groups (beam
search), or keeps a subset of the rows (finished rows leave the batch). Prompts in a batch
are left-padded: position ids count real tokens only, so a padded row computes exactly what it
would alone.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np

from registry.sizes import cache_shape
from runtime.contract import (
    CACHE_INPUT,
    CACHE_OUTPUT,
    DECODER,
    ENCODER,
    LAYOUT_DECODER,
    LAYOUT_ENCODER,
    MODEL_GRAPH,
    USE_CACHE_BRANCH,
    past_names,
)
from runtime.engine import Engine


def empty_past(engine: Engine, batch: int) -> list[np.ndarray]:
    card = engine.card
    return [np.zeros(cache_shape(card, batch, 0), np.float32) for _ in range(2 * card["n_layers"])]


class DecoderSession:
    file = MODEL_GRAPH

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        n_layers = engine.card["n_layers"]
        self.past_inputs = past_names(n_layers, CACHE_INPUT)
        self.past_outputs = past_names(n_layers, CACHE_OUTPUT)
        # each row's LoRA adapter (None: the base), for an export that keeps them apart
        # (runtime/adapters.py); None here: the engine's own choice for every row
        self.adapter_rows: list[str | None] | None = None

    def _run(self, ids: np.ndarray, positions: np.ndarray) -> np.ndarray:
        feeds = {"input_ids": ids, "attention_mask": self.mask, "position_ids": positions,
                 **dict(zip(self.past_inputs, self.past, strict=True))}
        if self.adapter_rows is not None:
            feeds.update(self.engine.adapters.feeds(self.adapter_rows))  # type: ignore[attr-defined]
        outputs = self.engine.run(self.file, feeds)
        self.past = [outputs[name] for name in self.past_outputs]
        return outputs["logits"][:, -1]

    def prefill(self, ids: np.ndarray, mask: np.ndarray | None) -> np.ndarray:
        self.mask = np.ones_like(ids, np.int64) if mask is None else mask.astype(np.int64)
        self.past = empty_past(self.engine, ids.shape[0])
        positions = np.clip(np.cumsum(self.mask, axis=1) - 1, 0, None)
        self.last_position = positions[:, -1]
        return self._run(ids.astype(np.int64), positions)

    def extend(self, ids: np.ndarray) -> np.ndarray:
        """Feed the next (B, T) prompt tokens of every row after its cache (a prompt
        prefilled in chunks, `zoo serve`): positions go on from each row's last one, and
        the causal mask lets token i see the cache and the chunk up to i, as in one pass."""
        self.mask = np.concatenate([self.mask, np.ones(ids.shape, np.int64)], axis=1)
        positions = self.last_position[:, None] + 1 + np.arange(ids.shape[1])
        self.last_position = positions[:, -1]
        return self._run(ids.astype(np.int64), positions)

    def step(self, tokens: np.ndarray) -> np.ndarray:
        self.mask = np.concatenate([self.mask, np.ones((len(tokens), 1), np.int64)], axis=1)
        self.last_position = self.last_position + 1
        return self._run(tokens[:, None].astype(np.int64), self.last_position[:, None])

    def reorder(self, rows: np.ndarray) -> None:
        self.past = [p[rows] for p in self.past]
        self.mask, self.last_position = self.mask[rows], self.last_position[rows]
        if self.adapter_rows is not None:
            self.adapter_rows = [self.adapter_rows[row] for row in rows]

    def expand(self, beams: int) -> None:
        self.reorder(np.repeat(np.arange(len(self.mask)), beams))

    def append(self, other: DecoderSession) -> None:
        """The rows of another session (a newcomer's prefill, `zoo serve`) join this batch
        after its own. The shorter side's cache and mask are padded on the left, masked out as
        a left-padded prompt is, so every row goes on computing what it computed alone."""
        width = max(self.mask.shape[1], other.mask.shape[1])
        self.past = [np.concatenate([_left_pad(mine, width, 2), _left_pad(theirs, width, 2)])
                     for mine, theirs in zip(self.past, other.past, strict=True)]
        self.mask = np.concatenate([_left_pad(self.mask, width, 1),
                                    _left_pad(other.mask, width, 1)])
        self.last_position = np.concatenate([self.last_position, other.last_position])
        if self.adapter_rows is not None or other.adapter_rows is not None:
            self.adapter_rows = [*(self.adapter_rows or [None] * (len(self.mask) - len(
                other.mask))), *(other.adapter_rows or [None] * len(other.mask))]

    def resume(self, past: list[np.ndarray]) -> None:
        """Start one row after keys/values computed before (`zoo serve`'s prefix cache: one
        (1, kv_heads, length, head_dim) array per cache input); `extend` feeds the rest of its
        prompt, positions going on after them."""
        length = past[0].shape[2]
        self.past = list(past)
        self.mask = np.ones((1, length), np.int64)
        self.last_position = np.array([length - 1])

    def keys_values(self, row: int, start: int, stop: int) -> list[np.ndarray]:
        """The keys/values of a row's real tokens start..stop (views, one (kv_heads,
        stop - start, head_dim) per cache input), for `zoo serve`'s prefix cache. A row's real
        tokens are contiguous after its left padding."""
        first = int(np.argmax(self.mask[row]))
        return [p[row, :, first + start:first + stop] for p in self.past]

    def make_room(self) -> None:
        """Its cache grows by one column a step: there is always room for the next token."""

    def trim(self) -> None:
        """Drop the leading columns no row attends to (left by rows that left the batch), so
        a long answer gone does not keep its width in every later step."""
        start = int(np.argmax(self.mask.any(axis=0)))
        if start:
            self.past = [p[:, :, start:] for p in self.past]
            self.mask = self.mask[:, start:]


def prompt_logits(engine: Engine, ids: list[int], chunk: int, adapter: str | None = None
                  ) -> Iterator[np.ndarray]:
    """The (T, vocab) logits at every position of one prompt, `chunk` tokens at a time: the
    contract graph over each chunk after the cache of those before it (as a chunked prefill
    computes), where the decoding loops keep only the last position's. Memory stays at
    `chunk` rows of logits, whatever the prompt's length (`zoo serve`'s echo scores a prompt
    of the whole context). `adapter`: a LoRA adapter of an export that keeps them apart."""
    adapted = {} if adapter is None else engine.adapters.feeds([adapter])  # type: ignore[attr-defined]
    names = past_names(engine.card["n_layers"], CACHE_INPUT), \
        past_names(engine.card["n_layers"], CACHE_OUTPUT)
    past = empty_past(engine, 1)
    for start in range(0, len(ids), chunk):
        piece = np.array([ids[start:start + chunk]], np.int64)
        end = start + piece.shape[1]
        feeds = {"input_ids": piece, "attention_mask": np.ones((1, end), np.int64),
                 "position_ids": np.arange(start, end, dtype=np.int64)[None],
                 **dict(zip(names[0], past, strict=True)), **adapted}
        outputs = engine.run(MODEL_GRAPH, feeds)
        past = [outputs[name] for name in names[1]]
        yield outputs["logits"][0]


def _left_pad(array: np.ndarray, width: int, axis: int) -> np.ndarray:
    """`array` padded with zeros before its first column along `axis` to `width` columns."""
    pad = [(0, 0)] * array.ndim
    pad[axis] = (width - array.shape[axis], 0)
    return np.pad(array, pad) if pad[axis][0] else array


class EncoderDecoderSession:
    """What the encoder-decoder sessions share (the text one below, Whisper's in
    runtime/speech_sessions.py): the cache names and the two ways through an export. Its own
    graphs: encoder.onnx returns the cross-attention keys/values (`present.*.encoder.*`), fed
    unchanged to every decoder.onnx step. The clients' layout (`layout` true: Optimum's and
    transformers.js's loop): encoder_model.onnx gives the memory alone;
    decoder_model_merged.onnx's first step (use_cache_branch false, every cache empty) projects
    it to the cross cache and returns it, and every later step (true) takes it back unchanged.
    A subclass says what the decoder reads of the source besides: `source_feeds`."""

    layout = False

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        n_layers = engine.card["n_layers"]
        self.past_inputs = past_names(n_layers, CACHE_INPUT, DECODER)
        self.past_outputs = past_names(n_layers, CACHE_OUTPUT, DECODER)
        self.cross_inputs = past_names(n_layers, CACHE_INPUT, ENCODER)
        self.cross_outputs = past_names(n_layers, CACHE_OUTPUT, ENCODER)

    def source_feeds(self) -> dict[str, np.ndarray]:
        """The decoder's inputs about the source besides its encoding (the text's mask)."""
        return {}

    def _encode(self, feeds: dict[str, np.ndarray]) -> None:
        """Run the encoder over the source's feeds; start an empty self cache."""
        if self.layout:
            self.memory = self.engine.run(LAYOUT_ENCODER, feeds)["last_hidden_state"]
            self.cross = {}  # until the first step returns it
        else:
            self.cross = self._cross_of(self.engine.run("encoder.onnx", feeds))
        batch = len(next(iter(feeds.values())))  # every feed is (B, ...)
        self.past = empty_past(self.engine, batch)

    def _decode(self, ids: np.ndarray) -> np.ndarray:
        """Target ids (B, T) after the cached steps: the last position's logits (B, vocab)."""
        feeds = {"input_ids": ids.astype(np.int64), **self.source_feeds(), **self.cross,
                 **dict(zip(self.past_inputs, self.past, strict=True))}
        first = self.layout and not self.cross
        if self.layout:
            feeds.update({"encoder_hidden_states": self.memory,
                          USE_CACHE_BRANCH: np.array([not first])})
        if first:
            feeds.update(zip(self.cross_inputs, empty_past(self.engine, len(ids)), strict=True))
        outputs = self.engine.run(LAYOUT_DECODER if self.layout else "decoder.onnx", feeds)
        self.past = [outputs[name] for name in self.past_outputs]
        if first:
            self.cross = self._cross_of(outputs)
        return outputs["logits"][:, -1]

    def _cross_of(self, outputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        return {name: outputs[output]
                for name, output in zip(self.cross_inputs, self.cross_outputs, strict=True)}


class Seq2SeqSession(EncoderDecoderSession):
    """A text source, encoded once and masked in every decoder step."""

    def prefill(self, ids: np.ndarray, mask: np.ndarray | None) -> np.ndarray:
        """Encode the source once, then feed the decoder's start token."""
        self.source_mask = np.ones_like(ids, np.int64) if mask is None else mask.astype(np.int64)
        self._encode({"input_ids": ids.astype(np.int64), "attention_mask": self.source_mask})
        return self.step(np.full(len(ids), self.engine.card["bos_token_id"], np.int64))

    def step(self, tokens: np.ndarray) -> np.ndarray:
        return self._decode(tokens[:, None])

    def source_feeds(self) -> dict[str, np.ndarray]:
        return {"encoder_attention_mask": self.source_mask}

    def expand(self, beams: int) -> None:
        """Each source's rows, cross cache included, `beams` times: once per search."""
        rows = np.repeat(np.arange(len(self.source_mask)), beams)
        self.past = [p[rows] for p in self.past]
        self.cross = {name: value[rows] for name, value in self.cross.items()}
        self.source_mask = self.source_mask[rows]

    def reorder(self, rows: np.ndarray) -> None:
        """Beam search picks rows within a source's beams, which share its cross cache: only
        the self cache moves. Fewer rows: finished sources leave (no beams), cross cache too."""
        self.past = [p[rows] for p in self.past]
        if len(rows) < len(self.source_mask):
            self.cross = {name: value[rows] for name, value in self.cross.items()}
            self.source_mask = self.source_mask[rows]


class LayoutSeq2SeqSession(Seq2SeqSession):
    """The loop Optimum's ORTModelForSeq2SeqLM and transformers.js run over the seq2seq layout
    (manifest `layout`); the memory's rows follow the beams as the caches do."""

    layout = True

    def expand(self, beams: int) -> None:
        self.memory = np.repeat(self.memory, beams, axis=0)
        super().expand(beams)

    def reorder(self, rows: np.ndarray) -> None:
        if len(rows) < len(self.source_mask):
            self.memory = self.memory[rows]
        super().reorder(rows)
