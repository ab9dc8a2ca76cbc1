"""Generation with an explicit key/value cache, over any engine (PyTorch or ONNX Runtime).

A session holds the cache and masks between steps: `prefill` runs the prompt (or, for the
encoder-decoder, encodes the source and feeds the start token) and returns the next-token logits;
`step` feeds one token per row. Prompts in a batch are left-padded: position ids count real
tokens only, so a padded row computes exactly what it would alone.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from export.contract import past_names
from export.engines import Engine
from registry.errors import ZooError


def empty_past(engine: Engine, batch: int) -> list[np.ndarray]:
    card = engine.card
    shape = (batch, card["n_heads"], 0, card["d_model"] // card["n_heads"])
    return [np.zeros(shape, np.float32) for _ in range(2 * card["n_layers"])]


class DecoderSession:
    file = "model.onnx"

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        n_layers = engine.card["n_layers"]
        self.past_inputs = past_names(n_layers, "past_key_values")
        self.past_outputs = past_names(n_layers, "present")

    def _run(self, ids: np.ndarray, positions: np.ndarray) -> np.ndarray:
        feeds = {"input_ids": ids, "attention_mask": self.mask, "position_ids": positions,
                 **dict(zip(self.past_inputs, self.past, strict=True))}
        outputs = self.engine.run(self.file, feeds)
        self.past = [outputs[name] for name in self.past_outputs]
        return outputs["logits"][:, -1]

    def prefill(self, ids: np.ndarray, mask: np.ndarray | None) -> np.ndarray:
        self.mask = np.ones_like(ids, np.int64) if mask is None else mask.astype(np.int64)
        self.past = empty_past(self.engine, ids.shape[0])
        positions = np.clip(np.cumsum(self.mask, axis=1) - 1, 0, None)
        self.last_position = positions[:, -1]
        return self._run(ids.astype(np.int64), positions)

    def step(self, tokens: np.ndarray) -> np.ndarray:
        self.mask = np.concatenate([self.mask, np.ones((len(tokens), 1), np.int64)], axis=1)
        self.last_position = self.last_position + 1
        return self._run(tokens[:, None].astype(np.int64), self.last_position[:, None])

    def reorder(self, rows: np.ndarray) -> None:
        self.past = [p[rows] for p in self.past]
        self.mask, self.last_position = self.mask[rows], self.last_position[rows]


class Seq2SeqSession:
    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        n_layers = engine.card["n_layers"]
        self.past_inputs = past_names(n_layers, "past_key_values", ".decoder")
        self.past_outputs = past_names(n_layers, "present", ".decoder")

    def prefill(self, ids: np.ndarray, mask: np.ndarray | None) -> np.ndarray:
        """Encode the source once, then feed the decoder's start token."""
        self.source_mask = np.ones_like(ids, np.int64) if mask is None else mask.astype(np.int64)
        feeds = {"input_ids": ids.astype(np.int64), "attention_mask": self.source_mask}
        self.memory = self.engine.run("encoder.onnx", feeds)["last_hidden_state"]
        self.past = empty_past(self.engine, ids.shape[0])
        return self.step(np.full(len(ids), self.engine.card["bos_token_id"], np.int64))

    def step(self, tokens: np.ndarray) -> np.ndarray:
        feeds = {"input_ids": tokens[:, None].astype(np.int64),
                 "encoder_hidden_states": self.memory,
                 "encoder_attention_mask": self.source_mask,
                 **dict(zip(self.past_inputs, self.past, strict=True))}
        outputs = self.engine.run("decoder.onnx", feeds)
        self.past = [outputs[name] for name in self.past_outputs]
        return outputs["logits"][:, -1]

    def reorder(self, rows: np.ndarray) -> None:
        self.past = [p[rows] for p in self.past]
        self.memory, self.source_mask = self.memory[rows], self.source_mask[rows]


@dataclass
class Sampling:
    """How to pick the next token: greedy (default), sampling, or beam search."""

    temperature: float = 0.0  # 0: greedy
    top_k: int = 0  # 0: no limit
    top_p: float = 1.0
    seed: int = 0
    beams: int = 1

    def check(self) -> None:
        if self.temperature < 0:
            raise ZooError(f"--temperature {self.temperature}: should be >= 0")
        if not 0 < self.top_p <= 1:
            raise ZooError(f"--top-p {self.top_p}: should be in (0, 1]")
        if self.top_k < 0 or self.beams < 1:
            raise ZooError("--top-k should be >= 0 and --beams >= 1")
        if self.beams > 1 and self.temperature > 0:
            raise ZooError("--beams and --temperature cannot be combined")


def open_session(engine: Engine, capacity: int | None = None, shared_cache: bool = True
                 ) -> DecoderSession | Seq2SeqSession:
    """The plain loop, or for an `--optimize` decoder export on CPU the loop over its
    shared-cache graph (same tokens, no per-step copies); `capacity`: prompt + new tokens."""
    kv_graph = getattr(engine, "kv_graph", None) if shared_cache else None
    if engine.card.family == "decoder" and kv_graph is not None:
        from export.kv_session import SharedCacheSession

        return SharedCacheSession(kv_graph, engine.card, capacity)
    if engine.card.family == "decoder":
        return DecoderSession(engine)
    if engine.card.family == "encoder-decoder":
        return Seq2SeqSession(engine)
    raise ZooError(f"{engine.card.name}: an encoder does not generate; use `zoo run` on it "
                   "for pooled vectors and masked-token predictions")


def _check_length(engine: Engine, prompt_length: int, new_tokens: int) -> None:
    limit = engine.card["max_positions"]
    target = new_tokens + 1 if engine.card.family == "encoder-decoder" else 0
    total = target if target else prompt_length + new_tokens
    if prompt_length > limit or total > limit:
        raise ZooError(f"{engine.card.name}: prompt of {prompt_length} plus {new_tokens} new "
                       f"tokens exceeds max_positions={limit}")


def _pick(logits: np.ndarray, sampling: Sampling, rng: np.random.Generator) -> np.ndarray:
    if sampling.temperature == 0:
        return logits.argmax(axis=-1)
    scaled = logits.astype(np.float64) / sampling.temperature
    if sampling.top_k:
        kth = np.sort(scaled, axis=-1)[:, -min(sampling.top_k, scaled.shape[-1])][:, None]
        scaled = np.where(scaled < kth, -np.inf, scaled)
    probs = np.exp(scaled - scaled.max(axis=-1, keepdims=True))
    probs /= probs.sum(axis=-1, keepdims=True)
    if sampling.top_p < 1:
        order = np.argsort(-probs, axis=-1)
        sorted_probs = np.take_along_axis(probs, order, axis=-1)
        # Keep the smallest prefix whose mass reaches top_p (always at least one token).
        outside = np.cumsum(sorted_probs, axis=-1) - sorted_probs >= sampling.top_p
        np.put_along_axis(probs, order, np.where(outside, 0.0, sorted_probs), axis=-1)
        probs /= probs.sum(axis=-1, keepdims=True)
    return np.array([rng.choice(len(row), p=row) for row in probs])


def generate(
    engine: Engine,
    ids: np.ndarray,
    mask: np.ndarray | None = None,
    new_tokens: int = 32,
    sampling: Sampling | None = None,
    eos: int | None = None,
    shared_cache: bool = True,
) -> np.ndarray:
    """New tokens (B, new_tokens) for left-padded prompts `ids` (B, T); rows that reach `eos`
    are padded with it afterwards. `shared_cache=False` forces the plain loop."""
    sampling = sampling or Sampling()
    sampling.check()
    ids = np.asarray(ids, np.int64)
    mask = np.ones_like(ids) if mask is None else np.asarray(mask, np.int64)
    _check_length(engine, ids.shape[1], new_tokens)
    vocab = engine.card["vocab_size"]
    if ids.size and (ids.min() < 0 or ids.max() >= vocab):
        raise ZooError(f"token ids should be in 0..{vocab - 1}, got {ids.min()}..{ids.max()}")
    empty_row = bool(ids.size) and int(mask.sum(axis=1).min()) == 0  # only the plain loop
    session = open_session(engine, ids.shape[1] + new_tokens, shared_cache and not empty_row)
    if sampling.beams > 1:
        return _beam_search(session, ids, mask, new_tokens, sampling.beams, eos)
    rng = np.random.default_rng(sampling.seed)
    logits = session.prefill(ids, mask)
    done = np.zeros(len(ids), bool)
    tokens = []
    for index in range(new_tokens):
        token = np.where(done, eos if eos is not None else 0, _pick(logits, sampling, rng))
        tokens.append(token)
        if eos is not None:
            done |= token == eos
            if done.all():
                break
        if index + 1 < new_tokens:
            logits = session.step(token)
    result = np.stack(tokens, axis=1)
    if result.shape[1] < new_tokens:  # every row ended early
        fill = np.full((len(ids), new_tokens - result.shape[1]), eos, np.int64)
        result = np.concatenate([result, fill], axis=1)
    return result


def _log_softmax(logits: np.ndarray) -> np.ndarray:
    shifted = logits.astype(np.float64) - logits.max(axis=-1, keepdims=True)
    return shifted - np.log(np.exp(shifted).sum(axis=-1, keepdims=True))


def _beam_search(session: DecoderSession | Seq2SeqSession, ids: np.ndarray, mask: np.ndarray,
                 new_tokens: int, beams: int, eos: int | None) -> np.ndarray:
    """Highest total log-probability sequence per row; finished beams keep emitting `eos`."""
    batch = len(ids)
    logits = session.prefill(ids, mask)
    session.reorder(np.repeat(np.arange(batch), beams))
    logits = np.repeat(logits, beams, axis=0)
    scores = np.full((batch, beams), -np.inf)
    scores[:, 0] = 0.0  # all beams start identical: expand only the first
    sequences = np.zeros((batch * beams, 0), np.int64)
    finished = np.zeros(batch * beams, bool)
    for index in range(new_tokens):
        log_probs = _log_softmax(logits)
        if eos is not None:  # a finished beam can only continue with eos, at no cost
            log_probs[finished] = -np.inf
            log_probs[finished, eos] = 0.0
        vocab = log_probs.shape[-1]
        total = (scores.reshape(-1, 1) + log_probs).reshape(batch, beams * vocab)
        best = np.argsort(-total, axis=-1, kind="stable")[:, :beams]
        scores = np.take_along_axis(total, best, axis=-1)
        rows = (np.arange(batch)[:, None] * beams + best // vocab).reshape(-1)
        token = (best % vocab).reshape(-1)
        sequences = np.concatenate([sequences[rows], token[:, None]], axis=1)
        finished = finished[rows] | (token == eos if eos is not None else False)
        if index + 1 < new_tokens:
            session.reorder(rows)
            logits = session.step(token)
    winner = scores.argmax(axis=-1)
    return sequences.reshape(batch, beams, -1)[np.arange(batch), winner]
