"""Continuous batching for a decoder export: one thread per export owns its decoding session
and decodes one token for every active row at a time.

A step: rows whose client left are dropped; waiting requests join (prefilled together in a
session of their own, left-padded as `zoo run` pads a batch of prompts, then their cache rows
appended to the batch); every row is fed its last token at once; each row picks its next
token with its own settings and generator; rows that finished (eos, max_tokens, a stop
string) leave. So a long answer never holds up a short one, and a newcomer waits at most one
step to start.

Prefill stalls the others for at most `prefill_chunk` tokens a step (PREFILL_TOKENS unless
`zoo serve --prefill-chunk` says): a prompt longer than that is prefilled in chunks of it, one
chunk a step in a session of its own (its cache grown by each chunk, positions going on), and
its row joins the batch after its last chunk, so the rows already decoding get a token between
two chunks; one long prompt is chunked at a time, the requests behind it wait their turn. A
step admits shorter newcomers while their padded prefill (rows x longest prompt) stays within
what the chunk left of the budget (always at least one when no chunk ran); the other
newcomers join at the next steps.

With a prefix cache (runtime/serve/prefix_cache.py), a prompt that begins with cached whole
blocks starts from their keys/values and is fed only the rest: a newcomer alone (`_resume`),
a long prompt as the first chunks of its `Filling`; every prefill's prompt is stored as its
jobs are admitted.

Rows may decode under different LoRA adapters of an export that keeps them apart (`zoo serve
--adapter`): each session's `adapter_rows` follows its rows as they join, leave and are
reordered, and the adapters' factors are fed stacked per row (runtime/adapters.py).

A row's greedy tokens are those of its prompt alone: in its prefill and in the batch its
cache is left-padded and masked out (runtime/decoding.py) or held in its own slots
(runtime/shared_cache.py), as rows of `zoo run`'s own batches are; a chunked prompt's cache
is the one a single pass makes (causal attention over the cache and the chunk); its sampler
draws from its own generator seeded as `zoo run --seed` seeds it.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from runtime.engine import Engine
from runtime.generate import left_padded, open_session
from runtime.grammar.engine import Constraint
from runtime.sampling import Sampling, pick_one
from runtime.serve.errors import log_fault
from runtime.serve.logprobs import Recorder
from runtime.serve.options import PREFILL_TOKENS
from runtime.serve.prefix_cache import PrefixCache, resumed, with_adapters
from runtime.serve.stops import StopFinder

LOG = logging.getLogger("zoo.serve")

Event = tuple[str, Any]  # ("piece", text), ("done", Completion) or ("error", message)


@dataclass
class Filling:
    """A long prompt being prefilled a chunk a step: its session and tokens fed so far."""

    job: Job
    session: Any = None  # opened with its first chunk
    fed: int = 0


@dataclass(frozen=True)
class Completion:
    """A generated answer: its prompt's length, the new tokens up to and with eos, the text
    (cut at the first stop string) and why it ended."""

    prompt_tokens: int
    ids: list[int]
    text: str
    finish_reason: str  # "stop" (eos or a stop string) or "length"

    def usage(self) -> dict[str, int]:
        return {"prompt_tokens": self.prompt_tokens, "completion_tokens": len(self.ids),
                "total_tokens": self.prompt_tokens + len(self.ids)}


@dataclass
class Job:
    """One generating request. `emit` delivers an event to its client's queue from the
    scheduler's thread; `cancelled` is set from the event loop when the client leaves."""

    prompt: list[int]
    max_tokens: int
    sampling: Sampling
    stops: tuple[str, ...]
    stream: bool
    emit: Callable[[Event], None]
    constraint: Constraint | None = None  # the grammar its answer must match, if any
    cancelled: bool = False
    tokens: list[int] = field(default_factory=list)
    sent: str = ""  # the text streamed so far
    first_token_at: float = 0.0  # time.perf_counter() when its first token was picked
    ended: bool = False  # its last event ("done", "gone" or "error") sent
    logprobs: Recorder | None = None  # where the client asked for its tokens' log-probabilities
    adapter: str | None = None  # its LoRA adapter (`zoo serve --adapter`); None: the base

    def __post_init__(self) -> None:
        self.rng = self.sampling.generator()
        self.finder = StopFinder(self.stops)  # built here, on the event loop

    def end(self, event: Event) -> None:
        self.ended = True
        self.emit(event)

    def choose(self, logits: np.ndarray) -> int:
        """The next token from this row's (vocab,) logits, with its own settings and
        generator, among those its grammar allows."""
        if self.constraint is None:
            token = pick_one(logits, self.sampling, self.rng)
        else:
            token = pick_one(self.constraint.mask(logits), self.sampling, self.rng)
            self.constraint.advance(token)
        if self.logprobs is not None:  # of the raw logits: a mask is the draw's alone
            self.logprobs.add(logits, token)
        return token


class Scheduler:
    def __init__(self, engine: Engine, max_batch: int, decode_text: Callable[[list[int]], str],
                 name: str, prefill_chunk: int = PREFILL_TOKENS,
                 prefix_cache: PrefixCache | None = None) -> None:
        self.engine, self.max_batch, self.decode_text = engine, max_batch, decode_text
        self.chunk = prefill_chunk
        self.prefix = prefix_cache  # prompts' keys/values kept for prompts that begin alike
        self.filling: Filling | None = None  # the long prompt being prefilled, if any
        self.eos: int | None = engine.card["eos_token_id"]
        self.inbox: deque[Job] = deque()
        self.wake = threading.Condition()
        self.rows: list[Job] = []  # row i of the session generates rows[i]
        self.session: Any = None
        self.pending = np.zeros(0, np.int64)  # each row's last token, fed at the next step
        self.steps = self.decoded = self.largest = 0  # for /metrics
        self.thread = threading.Thread(target=self._loop, name=f"batch-{name}", daemon=True)
        self.thread.start()

    def submit(self, job: Job) -> None:
        with self.wake:
            self.inbox.append(job)
            self.wake.notify()

    def gauges(self) -> tuple[int, int, int, int, int]:
        """(waiting, decoding now, steps, rows decoded over all steps, largest batch)."""
        with self.wake:
            waiting = len(self.inbox) + (self.filling is not None)
            return waiting, len(self.rows), self.steps, self.decoded, self.largest

    def _loop(self) -> None:
        while True:
            newcomers: list[Job] = []
            try:
                with self.wake:
                    while not self.inbox and not self.rows and self.filling is None:
                        self.wake.wait()
                    budget = self.chunk
                    if self.filling is not None:
                        budget -= min(self.chunk, len(self.filling.job.prompt) - self.filling.fed)
                    elif (self.inbox and len(self.inbox[0].prompt) > self.chunk
                          and len(self.rows) < self.max_batch):
                        self.filling, budget = Filling(self.inbox.popleft()), 0
                    newcomers = self._newcomers(budget)
                self._step(newcomers)
            except Exception as exc:  # a fault of the server: every job in hand ends with an
                log_fault(LOG, "decoding step", exc)  # error, and the thread goes on
                self._fail(newcomers)

    def _fail(self, newcomers: list[Job]) -> None:
        """End every job in hand with an error (each gives its place back) and start afresh;
        the jobs still waiting are decoded next."""
        filling = [self.filling.job] if self.filling else []
        for job in (*self.rows, *newcomers, *filling):
            if not job.ended:
                job.end(("error", "internal server error"))
        with self.wake:
            self.rows, self.session, self.pending = [], None, np.zeros(0, np.int64)
            self.filling = None

    def _newcomers(self, budget: int) -> list[Job]:
        """Waiting jobs (none longer than a chunk) whose padded prefill fits in `budget` (a
        whole chunk when no chunk ran: one always fits); a row stays free for the prompt
        being chunked."""
        newcomers: list[Job] = []
        longest = 0
        taken = len(self.rows) + (self.filling is not None)
        while self.inbox and taken + len(newcomers) < self.max_batch:
            if len(self.inbox[0].prompt) > self.chunk:
                break  # a long prompt's turn comes when the one being chunked is in
            longest = max(longest, len(self.inbox[0].prompt))
            if (len(newcomers) + 1) * longest > budget:
                break
            newcomers.append(self.inbox.popleft())
        return newcomers

    def _step(self, newcomers: list[Job]) -> None:
        gone = np.array([job.cancelled for job in self.rows], bool)
        if gone.any():
            left = [job for job, went in zip(self.rows, gone, strict=True) if went]
            self._keep(~gone)
            for job in left:  # told once out of the batch: /metrics no longer counts it
                job.end(("gone", None))
        self._fill()
        self._join(newcomers)
        if not self.rows:
            return
        self.session.make_room()
        logits = self.session.step(self.pending)
        with self.wake:
            self.steps += 1
            self.decoded += len(self.rows)
            self.largest = max(self.largest, len(self.rows))
        finished = np.zeros(len(self.rows), bool)
        endings: list[tuple[Job, Event]] = []
        for index, job in enumerate(self.rows):
            self.pending[index] = token = job.choose(logits[index])
            ending = self._advance(job, token)
            if ending is not None:
                finished[index] = True
                endings.append((job, ending))
        if finished.any():
            self._keep(~finished)
        for job, ending in endings:  # after its row left: a client with its answer is not
            job.end(ending)          # counted in /metrics' batch size any more

    def _join(self, newcomers: list[Job]) -> None:
        """Prefill the step's newcomers together, left-padded as `zoo run` pads a batch of
        prompts, pick their first tokens; the rows of those not done join the batch."""
        for job in newcomers:
            if job.cancelled:
                job.end(("gone", None))
        jobs = [job for job in newcomers if not job.ended]
        if self.prefix is not None:
            jobs = [job for job in jobs if not self._resume(job)]
        if not jobs:
            return
        ids, mask = left_padded([job.prompt for job in jobs],
                                self.engine.card["pad_token_id"] or 0)
        session = with_adapters(open_session(self.engine, ids.shape[1] + 1), self.engine,
                                [job.adapter for job in jobs])
        self._admit(jobs, session, session.prefill(ids, mask))

    def _resume(self, job: Job) -> bool:
        """Whether the job's prompt begins with a cached prefix: if so only the rest is fed,
        after it, in a session of its own, and the job is admitted."""
        session, fed = resumed(self.prefix, self.engine, job.prompt, job.adapter)
        if fed:
            self._admit([job], session, session.extend(np.array([job.prompt[fed:]], np.int64)))
        return bool(fed)

    def _fill(self) -> None:
        """The next chunk of the prompt being chunked; after its last one, its row joins."""
        filling = self.filling
        if filling is None:
            return
        job = filling.job
        if job.cancelled:
            with self.wake:
                self.filling = None
            job.end(("gone", None))
            return
        if filling.session is None:  # its cached prefix, if any, is not fed again
            filling.session, filling.fed = resumed(self.prefix, self.engine, job.prompt,
                                                   job.adapter)
        chunk = np.array([job.prompt[filling.fed:filling.fed + self.chunk]], np.int64)
        if filling.fed:
            logits = filling.session.extend(chunk)
        else:
            logits = filling.session.prefill(chunk, None)
        filling.fed += chunk.shape[1]
        if filling.fed == len(job.prompt):
            with self.wake:
                self.filling = None
            self._admit([job], filling.session, logits)

    def _admit(self, jobs: list[Job], session: Any, logits: np.ndarray) -> None:
        """Pick the first tokens of prefilled jobs; the rows of those not done join. Their
        prompts' keys/values go to the prefix cache once the first tokens (and the answers
        done at them) are sent: copying them is not in their time."""
        tokens = np.array([job.choose(row) for row, job in zip(logits, jobs, strict=True)],
                          np.int64)
        endings = [self._advance(job, int(token)) for job, token in zip(jobs, tokens, strict=True)]
        for job, ending in zip(jobs, endings, strict=True):
            if ending is not None:  # done at its first token: it never joins the batch
                job.end(ending)
        if self.prefix is not None:  # before a row leaves the session
            for row, job in enumerate(jobs):
                self.prefix.store(job.prompt, session, row, job.adapter)
        going = np.array([ending is None for ending in endings])
        if not going.any():
            return
        if not going.all():
            session.reorder(np.flatnonzero(going))
        with self.wake:
            if self.session is None:
                self.session = session
            else:
                self.session.append(session)
            self.rows += [job for job, goes in zip(jobs, going, strict=True) if goes]
            self.pending = np.concatenate([self.pending, tokens[going]])

    def _keep(self, keep: np.ndarray) -> None:
        """Only the rows in `keep` go on; no row left: the session goes (its buffers too)."""
        rows = np.flatnonzero(keep)
        with self.wake:
            if not len(rows):
                self.rows, self.session, self.pending = [], None, np.zeros(0, np.int64)
                return
            self.session.reorder(rows)
            if hasattr(self.session, "trim"):
                self.session.trim()
            self.rows = [self.rows[index] for index in rows]
            self.pending = self.pending[rows]

    def _advance(self, job: Job, token: int) -> Event | None:
        """Add the token to the job's answer; send what text is final; its last event when it
        is done (eos, its max_tokens, a stop string: cut there, as `zoo run`'s text cut there),
        for the caller to send once its row is out of the batch."""
        if not job.tokens:
            job.first_token_at = time.perf_counter()
        job.tokens.append(token)
        eos = token == self.eos
        done = eos or len(job.tokens) == job.max_tokens
        if not (job.stops or job.stream or done):
            return None
        text = self.decode_text(job.tokens)
        found = job.finder.update(text)
        if found.cut is not None:
            text, done, reason = text[:found.cut], True, "stop"
        else:
            reason = "stop" if eos else "length"
        if not done:
            # a piece of a character waits for the rest; text that may begin a stop string
            # waits to see whether it does
            if job.stream and text.startswith(job.sent) and not text.endswith("\ufffd"):
                ready = text[:len(text) - found.held]
                if len(ready) > len(job.sent):
                    job.emit(("piece", ready[len(job.sent):]))
                    job.sent = ready
            return None
        if job.stream and text.startswith(job.sent) and len(text) > len(job.sent):
            job.emit(("piece", text[len(job.sent):]))
        return ("done", Completion(len(job.prompt), job.tokens, text, reason))
