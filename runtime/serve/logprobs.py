"""Log-probabilities for `zoo serve` (OpenAI's `logprobs`, `top_logprobs` and `echo`).

A value is the log-softmax of the export's raw logits at temperature 1, in float64 as
runtime/sampling.py `log_softmax` computes it: what the model gives the token, whatever the
request's temperature, top_p or any mask does to the draw. A generated token is scored where
its row picks it (scheduler.py `Job.choose`, through a `Recorder`); an echoed prompt by one
chunked pass of the contract graph over it (runtime/decoding.py `prompt_logits`), its first
token with no value (nothing comes before it).

The answer's shapes are OpenAI's: a chat's `{"content": [{token, logprob, bytes,
top_logprobs}]}`, a completion's legacy `{tokens, token_logprobs, top_logprobs, text_offset}`.
A token's string is its bytes as text; a token that is a piece of a UTF-8 character (a
byte-level tokenizer splits one into several) has its `bytes` exactly, and its string escapes
the bytes that are not text (`\\xe2`; `bytes:\\xe2` in the legacy shape).
"""

from __future__ import annotations

import codecs
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from runtime.decoding import prompt_logits
from runtime.engine import Engine
from runtime.files.tokenizer import Tokenizer
from runtime.sampling import log_softmax

MAX_TOP_CHAT, MAX_TOP_COMPLETIONS = 20, 5  # as OpenAI


@dataclass(frozen=True)
class Scored:
    """One token's log-probability and the `top` likeliest tokens at its position, likeliest
    first (ties by id)."""

    token: int
    logprob: float
    top: tuple[tuple[int, float], ...]


def scored(logits: np.ndarray, token: int, top: int) -> Scored:
    """`token` scored against one position's (vocab,) raw logits."""
    row = log_softmax(logits)
    if not top:
        return Scored(token, float(row[token]), ())
    count = min(top, row.size)
    best = np.argpartition(-row, count - 1)[:count]  # the likeliest, in no order
    best = best[np.lexsort((best, -row[best]))]
    return Scored(token, float(row[token]), tuple((int(i), float(row[i])) for i in best))


class Recorder:
    """A generating row's tokens scored as they are picked (on the batching thread), and how
    many were handed on to its stream."""

    def __init__(self, top: int) -> None:
        self.top = top
        self.entries: list[Scored] = []
        self.sent = 0

    def add(self, logits: np.ndarray, token: int) -> None:
        self.entries.append(scored(logits, token, self.top))

    def unsent(self) -> list[Scored]:
        """The entries recorded since the last call."""
        new = self.entries[self.sent:]
        self.sent += len(new)
        return new


def prompt_scores(engine: Engine, ids: list[int], top: int, chunk: int,
                  adapter: str | None = None) -> list[Scored | None]:
    """Each prompt token scored by the logits of the position before it; the first gets None.
    `chunk` prompt tokens a pass bound the memory (their logits); `adapter`: the LoRA
    adapter the prompt runs under (`zoo serve --adapter`), None the base."""
    out: list[Scored | None] = [None]
    start = 0
    for logits in prompt_logits(engine, ids, chunk, adapter):
        for offset, row in enumerate(logits):
            position = start + offset + 1  # the token this row predicts
            if position < len(ids):
                out.append(scored(row, ids[position], top))
        start += len(logits)
    return out


class TokenTexts:
    """A served export's tokens as bytes and strings, each worked out once."""

    def __init__(self, tokenizer: Tokenizer | None) -> None:
        self.tokenizer = tokenizer
        self.known: dict[int, tuple[bytes, bool]] = {}

    def of(self, token: int) -> tuple[bytes, bool]:
        """(its bytes, whether the decoded text shows it: special tokens are dropped)."""
        if token not in self.known:
            tokenizer = self.tokenizer
            if tokenizer is None:  # ids in, ids out: named by their id, as vLLM's option does
                self.known[token] = f"token_id:{token}".encode(), False
            else:
                exact = getattr(tokenizer, "token_bytes", None)
                shown = tokenizer.decode([token]) != ""
                raw = exact(token) if exact else (tokenizer.decode([token])
                                                  or tokenizer.label(token)).encode()
                self.known[token] = raw, shown
        return self.known[token]

    def text(self, token: int, legacy: bool = False) -> str:
        raw = self.of(token)[0]
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError:  # a piece of a character: OpenAI's escapes
            if legacy:
                return "bytes:" + "".join(f"\\x{byte:02x}" for byte in raw)
            return raw.decode("utf-8", errors="backslashreplace")

    def entry(self, token: int, logprob: float) -> dict[str, Any]:
        return {"token": self.text(token), "logprob": logprob,
                "bytes": list(self.of(token)[0])}

    def chat(self, entries: list[Scored]) -> list[dict[str, Any]]:
        """The chat's `logprobs.content`: an entry a token with its top alternatives."""
        return [{**self.entry(e.token, e.logprob),
                 "top_logprobs": [self.entry(token, value) for token, value in e.top]}
                for e in entries]

    def legacy(self, entries: Sequence[Scored | None], tokens: list[int], offsets: Offsets
               ) -> dict[str, Any]:
        """/v1/completions' `logprobs` for `tokens` (an entry each, None for an echoed first
        token): each token's `top` likeliest and the token itself (OpenAI's up to
        logprobs + 1), a string a key (the likeliest kept where two tokens read alike)."""
        tops: list[dict[str, float] | None] = []
        for entry in entries:
            if entry is None:
                tops.append(None)
                continue
            top: dict[str, float] = {}
            for token, value in (*entry.top, (entry.token, entry.logprob)):
                top.setdefault(self.text(token, legacy=True), value)
            tops.append(top)
        return {"tokens": [self.text(token, legacy=True) for token in tokens],
                "token_logprobs": [None if e is None else e.logprob for e in entries],
                "top_logprobs": tops, "text_offset": offsets.take(tokens)}


class Offsets:
    """Where each token's text starts in the answer's text, in characters: the tokens' bytes
    decoded as they come (a piece of a character starts where that character does; a token
    the text drops adds nothing)."""

    def __init__(self, texts: TokenTexts, start: int = 0) -> None:
        self.texts, self.at = texts, start
        self.decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def take(self, tokens: list[int]) -> list[int]:
        out = []
        for token in tokens:
            out.append(self.at)
            raw, shown = self.texts.of(token)
            if shown:
                self.at += len(self.decoder.decode(raw))
        return out


class Shaper:
    """One answer's `logprobs` values, whole or a stream's chunk at a time (the legacy
    shape's offsets go on from chunk to chunk); None where the request asked for none."""

    def __init__(self, texts: TokenTexts, chat: bool, asked: bool) -> None:
        self.texts, self.chat, self.asked = texts, chat, asked
        self.offsets = Offsets(texts)

    def prompt(self, ids: list[int], scores: list[Scored | None] | None, echoed: str
               ) -> dict[str, Any] | None:
        """An echoed prompt's (legacy) values; the answer's offsets start after its text."""
        shaped = self.texts.legacy(scores, ids, self.offsets) if scores is not None else None
        self.offsets = Offsets(self.texts, len(echoed))
        return shaped

    def shaped(self, entries: list[Scored]) -> dict[str, Any] | None:
        if not self.asked:
            return None
        if self.chat:
            return {"content": self.texts.chat(entries)}
        return self.texts.legacy(entries, [e.token for e in entries], self.offsets)


def joined(first: dict[str, Any] | None, then: dict[str, Any] | None) -> dict[str, Any] | None:
    """Two legacy values one after the other (an echoed prompt's and its answer's)."""
    if first is None or then is None:
        return first or then
    return {key: first[key] + then[key] for key in first}
