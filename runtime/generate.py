"""Generation with an explicit key/value cache over any engine (PyTorch or ONNX Runtime): the
family's spec picks the session (registry/families.py), runtime/sampling.py the tokens."""

from __future__ import annotations

from typing import Any

import numpy as np

from registry.errors import ZooError
from runtime.decoding import DecoderSession, Seq2SeqSession
from runtime.engine import Engine
from runtime.prompts import check_ids
from runtime.sampling import Sampling, check_new_tokens, decode
from runtime.shared_cache import SharedCacheSession


def open_session(engine: Engine, capacity: int | None = None, shared_cache: bool = True) -> Any:
    """The session the family's spec calls for: the encoder-decoder's over its two graphs; a
    decoder's plain loop, or for an `--optimize` export on CPU the loop over its shared-cache
    graph (same tokens, no per-step copies); `capacity`: prompt + new tokens."""
    spec = engine.spec
    if not spec.generates:
        raise ZooError(f"{engine.card.name}: an encoder does not generate; use `zoo run` on it "
                       "for pooled vectors and masked-token predictions")
    if spec.cross_attention:
        return Seq2SeqSession(engine)
    kv_graph = getattr(engine, "kv_graph", None) if shared_cache else None
    if kv_graph is not None:
        return SharedCacheSession(kv_graph, engine.card, capacity)
    return DecoderSession(engine)


def _check_length(engine: Engine, prompt_length: int, new_tokens: int) -> None:
    limit = engine.card["max_positions"]
    spec = engine.spec
    total = spec.generated_length(prompt_length, new_tokens)
    if prompt_length > limit and not spec.continues_prompt:
        raise ZooError(f"{engine.card.name}: source of {prompt_length} tokens exceeds "
                       f"max_positions={limit}")
    if prompt_length > limit or total > limit:
        raise ZooError(f"{engine.card.name}: prompt of {prompt_length} plus {new_tokens} new "
                       f"tokens exceeds max_positions={limit}")


def left_padded(prompts: list[list[int]], pad: int) -> tuple[np.ndarray, np.ndarray]:
    """(ids, attention_mask) of prompts of any lengths, padded on the left: the layout
    `generate` takes, so every row's next token sits in the last column."""
    width = max(len(prompt) for prompt in prompts)
    ids = np.array([[pad] * (width - len(p)) + p for p in prompts], np.int64)
    mask = np.array([[0] * (width - len(p)) + [1] * len(p) for p in prompts], np.int64)
    return ids, mask


def generate(
    engine: Engine,
    ids: np.ndarray,
    mask: np.ndarray | None = None,
    new_tokens: int = 32,
    sampling: Sampling | None = None,
    eos: int | None = None,
    shared_cache: bool = True,
    constraints: list[Any] | None = None,
) -> np.ndarray:
    """New tokens (B, new_tokens) for left-padded prompts `ids` (B, T); rows that reach `eos`
    are padded with it afterwards. `shared_cache=False` forces the plain loop; `constraints`:
    a grammar state per row (runtime/grammar/engine.py)."""
    sampling = sampling or Sampling()
    sampling.check()
    if constraints is not None and sampling.beams > 1:
        raise ZooError("--beams cannot be combined with --json-schema or --regex: a grammar "
                       "constrains one sequence per prompt")
    check_new_tokens(new_tokens)
    ids = np.asarray(ids, np.int64)
    mask = np.ones_like(ids) if mask is None else np.asarray(mask, np.int64)
    _check_length(engine, ids.shape[1], new_tokens)
    check_ids(engine.card, ids)
    empty_row = bool(ids.size) and int(mask.sum(axis=1).min()) == 0  # only the plain loop
    session = open_session(engine, ids.shape[1] + new_tokens, shared_cache and not empty_row)
    return decode(session, ids, mask, new_tokens, sampling, eos, constraints)
