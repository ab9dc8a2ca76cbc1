"""`zoo serve`'s prefix cache (issue 45): the keys/values a prefill computed for a prompt's
first tokens, kept so that a later prompt that begins with the same tokens (a system prompt,
few-shot examples, a chat's history) skips computing them again. One per decoder export,
used by its scheduler's thread only (the counters are read by /metrics under the lock).

Matching is exact on token ids. The cache is a trie of fixed-size blocks of BLOCK tokens: a
block is keyed in one dict by (its parent block's id, its tokens as a tuple), so a lookup walks
a prompt's blocks from its first and stops at the first one not held. Dict keys compare by
equality, so, unlike a key that is only a hash (vLLM's), no collision can ever serve another
prompt's values; prompts that share a prefix share its blocks' storage. A match covers whole
blocks and never the prompt's last token, whose logits pick the first new token: the rest of
the prompt is fed after the cached keys/values (the sessions' `resume`, then `extend`).

An export that keeps LoRA adapters apart (`zoo serve --adapter`) computes other keys/values
for the same tokens under each adapter: a prompt's first block hangs under its adapter's own
root, so a prefix cached under one adapter is never served to another (or to the base).

Bounded by the bytes of the blocks' keys/values, the least recently used evicted first. A
lookup or a store touches a chain of blocks from its last block to its first, so a block is
always more recent than every block after it: eviction takes the ends of chains first, and a
block never outlives its parent (no block held that no lookup can reach).
"""

from __future__ import annotations

import itertools
import threading
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

import numpy as np

from runtime.engine import Engine
from runtime.generate import open_session

BLOCK = 16  # tokens a block: vLLM's default; a shared prefix is reused up to 15 tokens short
ROOT = 0  # the parent id of a prompt's first block (under an adapter: (ROOT, its name))
Key = tuple[Any, tuple[int, ...]]  # (parent block's id, the block's tokens)


@dataclass
class Block:
    key: Key
    id: int
    values: np.ndarray  # (cache inputs, kv_heads, BLOCK, head_dim): every layer's keys, values


class PrefixCache:
    def __init__(self, limit: int, block: int = BLOCK) -> None:
        self.limit, self.block = limit, block  # limit: bytes of keys/values held at most
        self.blocks: OrderedDict[Key, Block] = OrderedDict()  # least recently used first
        self.bytes = self.hit_tokens = self.miss_tokens = 0
        self.lock = threading.Lock()
        self._ids = itertools.count(ROOT + 1)

    def lookup(self, prompt: list[int], adapter: str | None = None
               ) -> list[np.ndarray] | None:
        """The keys/values of the prompt's longest cached prefix of whole blocks short of its
        last token (one (1, kv_heads, length, head_dim) array per cache input), or None; its
        tokens are counted as hit, the rest as missed."""
        with self.lock:
            chain = self._chain(prompt, (len(prompt) - 1) // self.block, adapter)
            self._touch(chain)
            hit = len(chain) * self.block
            self.hit_tokens += hit
            self.miss_tokens += len(prompt) - hit
            if not chain:
                return None
            values = np.concatenate([block.values for block in chain], axis=2)
        return [inputs[None] for inputs in values]

    def store(self, prompt: list[int], session: Any, row: int, adapter: str | None = None
              ) -> None:
        """Keep the keys/values that row `row` of a session computed for the prompt's whole
        blocks (copied: the session goes on): those not held yet, as many as the bound
        allows, making room by evicting the least recently used."""
        with self.lock:
            chain = self._chain(prompt, len(prompt) // self.block, adapter)
            self._touch(chain)
            size = sum(view.nbytes for view in session.keys_values(row, 0, self.block)) \
                if len(prompt) >= self.block else 0
            wanted = min(len(prompt) // self.block, self.limit // size if size else 0)
            if wanted <= len(chain):
                return
            self._evict(self.bytes + (wanted - len(chain)) * size - self.limit)
            parent = chain[-1].id if chain else _root(adapter)
            try:
                for start in range(len(chain) * self.block, wanted * self.block, self.block):
                    key = self._key(parent, prompt, start)
                    values = np.stack(session.keys_values(row, start, start + self.block))
                    block = Block(key, next(self._ids), values)
                    self.blocks[key] = block
                    self.bytes += values.nbytes
                    chain.append(block)
                    parent = block.id
            finally:  # even after a fault: a block stays more recent than those after it
                self._touch(chain)

    def stats(self) -> tuple[int, int, int, int]:
        """(prompt tokens hit, prompt tokens missed, bytes held, the bound), for /metrics."""
        with self.lock:
            return self.hit_tokens, self.miss_tokens, self.bytes, self.limit

    def _chain(self, prompt: list[int], blocks: int, adapter: str | None) -> list[Block]:
        """The held blocks among the prompt's first `blocks`, up to the first not held."""
        chain: list[Block] = []
        parent = _root(adapter)
        for start in range(0, blocks * self.block, self.block):
            block = self.blocks.get(self._key(parent, prompt, start))
            if block is None:
                break
            chain.append(block)
            parent = block.id
        return chain

    def _key(self, parent: Any, prompt: list[int], start: int) -> Key:
        """The key of the prompt's block from `start`, after the block `parent`."""
        return parent, tuple(prompt[start:start + self.block])

    def _touch(self, chain: list[Block]) -> None:
        """Most recently used, the first block last: more recent than the blocks after it."""
        for block in reversed(chain):
            self.blocks.move_to_end(block.key)

    def _evict(self, excess: int) -> None:
        """Drop least recently used blocks (ends of chains) until `excess` bytes are freed."""
        while excess > 0 and self.blocks:
            _, block = self.blocks.popitem(last=False)
            self.bytes -= block.values.nbytes
            excess -= block.values.nbytes


def _root(adapter: str | None) -> Any:
    return ROOT if adapter is None else (ROOT, adapter)


def with_adapters(session: Any, engine: Engine, adapters: list[str | None]) -> Any:
    """The session, its rows decoding under `adapters` where the export keeps them apart
    (runtime/adapters.py); an export without them is left as it is."""
    if getattr(engine, "adapters", None) is not None and engine.adapters.inputs:  # type: ignore[attr-defined]
        session.adapter_rows = list(adapters)
    return session


def resumed(cache: PrefixCache | None, engine: Engine, prompt: list[int],
            adapter: str | None = None) -> tuple[Any, int]:
    """A session for one prompt under `adapter` (None: the base) and how many of its tokens
    it already holds: its longest cached prefix's keys/values (fed the rest by `extend`), or
    none (0: to prefill)."""
    session = with_adapters(open_session(engine, len(prompt) + 1), engine, [adapter])
    past = cache.lookup(prompt, adapter) if cache is not None else None
    if past is None:
        return session, 0
    session.resume(past)
    return session, past[0].shape[2]
