"""Generation over the shared-cache graph (export/onnx/shared_cache.py) with I/O binding.

Everything a decoding step touches is allocated once: the cache buffers (bound as both the
`past_key_values.*` input and the `present.*` output, so GroupQueryAttention appends in place),
the logits, and the small id/position/length arrays, which are numpy arrays that share memory
with the OrtValues bound to the session. A step writes the new token into those arrays and runs;
nothing is copied or allocated per step except the logits handed back to the caller.

Same interface as decoding.DecoderSession (prefill, step, reorder), so generate() drives it
unchanged; rows that finish leave by `reorder` to fewer rows, which binds the first rows of the
same buffers; tests check it picks the same tokens as the plain loop.
"""

from __future__ import annotations

import numpy as np
import onnxruntime as ort

from registry.catalog import Card
from registry.errors import ZooError
from registry.sizes import cache_shape
from runtime.contract import CACHE_INPUT, CACHE_OUTPUT, past_names
from runtime.sessions import ORT_DTYPES, Graph


class SharedCacheSession:
    def __init__(self, graph: Graph, card: Card, capacity: int | None = None) -> None:
        self.graph = graph
        self.card = card
        self.capacity = min(capacity or card["max_positions"], card["max_positions"])
        self.past_inputs = past_names(card["n_layers"], CACHE_INPUT)
        self.past_outputs = past_names(card["n_layers"], CACHE_OUTPUT)
        self.batch = 0  # rows bound now
        self.held = 0  # rows the buffers hold

    def _allocate(self, batch: int) -> None:
        """Buffers for `batch` rows; zeroed, so unused slots hold no stale rows."""
        self.held = batch
        shape = cache_shape(self.card, batch, self.capacity)
        inputs, outputs = self.graph.inputs, self.graph.session.get_outputs()
        cache_type = ORT_DTYPES[inputs[self.past_inputs[0]].type]  # float16 in an fp16 export
        logits_type = ORT_DTYPES[next(o.type for o in outputs if o.name == "logits")]
        self.buffers = [np.zeros(shape, cache_type) for _ in self.past_inputs]
        self.full_logits = np.zeros((batch, self.card["vocab_size"]), logits_type)
        self.full_ids = np.zeros((batch, 1), np.int64)
        self.full_positions = np.zeros((batch, 1), np.int64)
        self.full_seqlens = np.zeros(batch, np.int32)
        self.total = np.array(self.capacity, np.int32)  # > 1: marks a decoding step
        self._bind(batch)

    def _bind(self, batch: int) -> None:
        """Bind the first `batch` rows of every buffer (contiguous views: no copy), so a batch
        that shrinks as rows finish runs in the buffers it has."""
        self.batch = batch
        self.logits = self.full_logits[:batch]
        self.ids, self.positions = self.full_ids[:batch], self.full_positions[:batch]
        self.seqlens = self.full_seqlens[:batch]
        self.lengths = np.zeros(batch, np.int64)  # tokens held per row
        self.binding = self.graph.session.io_binding()
        # Keep the OrtValues alive as long as the binding that refers to them.
        self.values = [ort.OrtValue.ortvalue_from_numpy(a[:batch]) for a in self.buffers]
        for name_in, name_out, value in zip(self.past_inputs, self.past_outputs, self.values,
                                            strict=True):
            self.binding.bind_ortvalue_input(name_in, value)
            self.binding.bind_ortvalue_output(name_out, value)
        self.logits_value = ort.OrtValue.ortvalue_from_numpy(self.logits)
        self.binding.bind_ortvalue_output("logits", self.logits_value)

    def _bind_step_inputs(self) -> None:
        self.step_values = {name: ort.OrtValue.ortvalue_from_numpy(array) for name, array in (
            ("input_ids", self.ids), ("position_ids", self.positions),
            ("seqlens_k", self.seqlens), ("total_sequence_length", self.total))}
        for name, value in self.step_values.items():
            self.binding.bind_ortvalue_input(name, value)

    def _run(self) -> np.ndarray:
        self.graph.session.run_with_iobinding(self.binding)
        # a copy: the next step overwrites the bound buffer; float32 for the caller
        return self.logits.astype(np.float32)

    def prefill(self, ids: np.ndarray, mask: np.ndarray | None) -> np.ndarray:
        """Compact each row's real tokens to the front (positions count real tokens, exactly
        as in the contract graph), run them in one pass, and return the last token's logits."""
        mask = np.ones_like(ids, np.int64) if mask is None else np.asarray(mask, np.int64)
        lengths = mask.sum(axis=1)
        if lengths.min() < 1:
            raise ZooError("every prompt needs at least one real token (attention_mask row "
                           "of zeros)")
        width = int(lengths.max())
        if width > self.capacity:
            raise ZooError(f"prompt of {width} tokens exceeds the cache capacity "
                           f"{self.capacity}")
        if len(ids) > self.held:
            self._allocate(len(ids))
        elif self.batch != len(ids):
            self._bind(len(ids))
        compact = np.zeros((len(ids), width), np.int64)
        for row, (tokens, keep) in enumerate(zip(ids, mask, strict=True)):
            compact[row, : lengths[row]] = tokens[keep.astype(bool)]
        positions = np.minimum(np.arange(width)[None], (lengths - 1)[:, None]).astype(np.int64)
        self.lengths[:] = lengths
        # Named, so that the arrays outlive the run that reads them.
        self.prefill_inputs = {"input_ids": compact, "position_ids": positions,
                               "seqlens_k": (lengths - 1).astype(np.int32),
                               "total_sequence_length": np.array(width, np.int32)}
        for name, value in self.prefill_inputs.items():
            self.binding.bind_cpu_input(name, value)
        logits = self._run()
        self._bind_step_inputs()
        return logits

    def extend(self, ids: np.ndarray) -> np.ndarray:
        """Feed the next T prompt tokens of a single row after its cache (a prompt prefilled
        in chunks, `zoo serve`): GroupQueryAttention's subsequent prompt, which takes one
        row only; the last token's logits."""
        if self.batch != 1 or ids.shape[0] != 1:
            raise ZooError("a prompt is extended one row at a time")
        length, width = int(self.lengths[0]), ids.shape[1]
        if length + width > self.capacity:
            raise ZooError(f"prompt of {length + width} tokens exceeds the cache capacity "
                           f"{self.capacity}")
        self.prefill_inputs = {
            "input_ids": ids.astype(np.int64),
            "position_ids": (length + np.arange(width))[None].astype(np.int64),
            "seqlens_k": np.array([length + width - 1], np.int32),
            "total_sequence_length": np.array(length + width, np.int32)}
        for name, value in self.prefill_inputs.items():
            self.binding.bind_cpu_input(name, value)
        logits = self._run()
        self.lengths += width
        self._bind_step_inputs()
        return logits

    def resume(self, past: list[np.ndarray]) -> None:
        """Start one row after keys/values computed before (`zoo serve`'s prefix cache: one
        (1, kv_heads, length, head_dim) array per cache input), written into its slots;
        `extend` feeds the rest of its prompt."""
        length = past[0].shape[2]
        if length >= self.capacity:
            raise ZooError(f"a cached prefix of {length} tokens leaves no room in the cache "
                           f"capacity {self.capacity}")
        self._allocate(1)  # zeroed: nothing past the prefix
        for buffer, cached in zip(self.buffers, past, strict=True):
            buffer[0, :, :length] = cached[0]
        self.lengths[:] = length
        self._bind_step_inputs()

    def keys_values(self, row: int, start: int, stop: int) -> list[np.ndarray]:
        """The keys/values of a row's tokens start..stop (views, one (kv_heads, stop - start,
        head_dim) per cache input), for `zoo serve`'s prefix cache: a row's tokens sit at the
        front of its slots."""
        return [buffer[row, :, start:stop] for buffer in self.buffers]

    def step(self, tokens: np.ndarray) -> np.ndarray:
        if int(self.lengths.max()) >= self.capacity:
            raise ZooError(f"generation exceeds the cache capacity {self.capacity}")
        self.ids[:, 0] = tokens
        self.positions[:, 0] = self.lengths  # the next position counts real tokens
        self.seqlens[:] = self.lengths  # = total length after this token - 1
        logits = self._run()
        self.lengths += 1
        return logits

    def reorder(self, rows: np.ndarray) -> None:
        """Keep/duplicate rows: beam search (the batch may grow from B to B * beams), or
        finished rows leaving (it shrinks). In place when it does not grow: only the rows
        whose slot changes are copied."""
        lengths = self.lengths[rows]
        if len(rows) > self.held:
            kept = [buffer[rows] for buffer in self.buffers]
            self._allocate(len(rows))
            for buffer, rows_kept in zip(self.buffers, kept, strict=True):
                buffer[...] = rows_kept
        else:
            moved = np.flatnonzero(rows != np.arange(len(rows)))
            for buffer in self.buffers:
                buffer[moved] = buffer[rows[moved]]  # the right side is a copy: no overlap
            if len(rows) != self.batch:
                self._bind(len(rows))
        self.lengths[:] = lengths
        self._bind_step_inputs()

    def expand(self, beams: int) -> None:
        self.reorder(np.repeat(np.arange(self.batch), beams))

    def append(self, other: SharedCacheSession) -> None:
        """The rows of another session of this graph (a newcomer's prefill, `zoo serve`)
        join this batch after its own: each row's tokens are copied into the next free slot.
        The buffers grow (rows and capacity doubled, up to max_positions) when they must."""
        rows = self.batch + other.batch
        longest = int(other.lengths.max())
        if rows > self.held or longest + 1 > self.capacity:
            self.grow(max(rows, 2 * self.held) if rows > self.held else self.held, longest + 1)
        for mine, theirs in zip(self.buffers, other.buffers, strict=True):
            mine[self.batch:rows] = 0
            mine[self.batch:rows, :, :longest] = theirs[:other.batch, :, :longest]
        lengths = np.concatenate([self.lengths, other.lengths])
        self._bind(rows)
        self.lengths[:] = lengths
        self._bind_step_inputs()

    def make_room(self) -> None:
        """Room in every row for the next step's token (the capacity doubled if not)."""
        longest = int(self.lengths.max())
        if longest + 1 > self.capacity:
            self.grow(self.held, longest + 1)

    def grow(self, rows: int, capacity: int) -> None:
        """Buffers of `rows` rows and at least `capacity` tokens (doubled from the present
        capacity, so a row a token at a time reallocates rarely); the rows bound are kept."""
        limit = self.card["max_positions"]
        if capacity > limit:
            raise ZooError(f"generation exceeds max_positions={limit}")
        old, kept = (self.buffers, self.capacity) if self.held else ([], 0)
        batch, lengths = self.batch, self.lengths if self.held else np.zeros(0, np.int64)
        if capacity > self.capacity:
            self.capacity = min(limit, max(capacity, 2 * self.capacity))
        self._allocate(rows)
        for buffer, before in zip(self.buffers, old, strict=False):
            buffer[:batch, :, :kept] = before[:batch]
        self._bind(batch)
        self.lengths[:] = lengths[:batch]
        self._bind_step_inputs()
