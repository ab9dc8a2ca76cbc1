"""One served export. A decoder's generation goes to its scheduler (continuous batching,
runtime/serve/scheduler.py), a sentence vector's and a classifier's to its embedder
(runtime/serve/embedder.py, batched by length); an encoder-decoder's generation runs in the
export's worker thread one request at a time (whole, then streamed in pieces). Admission is
bounded: max_batch rows decoding (1 in the worker) and max_queue waiting; past that a request
gets 429. A decoder's echoed prompt is scored in that worker too (runtime/serve/logprobs.py),
off the event loop and the batching thread, one prompt at a time."""

from __future__ import annotations

import asyncio
import contextlib
import copy
import io
import logging
import re
import secrets
import threading
import time
from collections.abc import AsyncIterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from registry.errors import ZooError
from registry.paths import display_path
from runtime.classify import SequenceOutputs, label_names, run_images
from runtime.exported import Exported, GenerateOptions, load
from runtime.files.images import decoded_rgb, export_processor, pixel_values
from runtime.files.tokenizer import sequence_ids
from runtime.grammar.engine import Constraint, Grammar
from runtime.prompts import check_text
from runtime.serve.bodies import Sampled
from runtime.serve.embedder import Embedder
from runtime.serve.errors import ApiError, internal_error, log_fault
from runtime.serve.logprobs import Recorder, Scored, TokenTexts, prompt_scores
from runtime.serve.options import PREFILL_TOKENS, PREFIX_CACHE_MB, ServeOptions
from runtime.serve.prefix_cache import PrefixCache
from runtime.serve.scheduler import Completion, Event, Job, Scheduler
from runtime.transcribe import TranscribeOptions
from runtime.transcript import Transcript

LOG = logging.getLogger("zoo.serve")
ADAPTER_NAME = re.compile(r"[A-Za-z0-9_.-]+")  # --adapter NAME=FILE: NAME, served as OUT:NAME
ENDS = ("done", "gone", "error")  # a job's last event


@dataclass
class Ticket:
    """A generating request's events, delivered on the event loop as they come."""

    queue: asyncio.Queue[Event]
    job: Job

    def cancel(self) -> None:
        """The client left: its row is dropped at the next step (no-op once it ended)."""
        self.job.cancelled = True

    async def events(self) -> AsyncIterator[Event]:
        while True:
            event = await self.queue.get()
            yield event
            if event[0] in ENDS:
                return

    async def completion(self) -> Completion:
        async for name, value in self.events():
            if name == "done":
                return value
            if name == "gone":  # nginx's status for it: no one reads this answer
                raise ApiError(499, "the client closed the request", None, "client_gone")
        raise internal_error()


class Served:
    """An export under its name; `admitted` counts its requests running or waiting. A LoRA
    adapter of a decoder export that keeps them apart is served as a model of its own
    (`under_adapter`: BASE:NAME) that shares the export's scheduler, so requests for
    different adapters decode in one batch."""

    adapter: str | None = None  # the LoRA adapter its requests decode under; None: the base

    def __init__(self, name: str, exported: Exported, max_queue: int, max_batch: int = 1,
                 prefill_chunk: int = PREFILL_TOKENS, prefix_cache_mb: int = PREFIX_CACHE_MB
                 ) -> None:
        self.name, self.exported, self.max_queue = name, exported, max_queue
        self.prefill_chunk = prefill_chunk
        self.token_texts = TokenTexts(exported.tokenizer)
        self.worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"serve-{name}")
        spec, card = exported.runtime.spec, exported.card
        batched = spec.generates and not spec.cross_attention
        self.prefix_cache = PrefixCache(prefix_cache_mb * 2**20) \
            if batched and prefix_cache_mb else None
        self.scheduler = Scheduler(exported.runtime, max_batch, self.text, name,
                                   prefill_chunk, self.prefix_cache) \
            if batched else None
        self.embedder = Embedder(exported.runtime, name) if card["pooling"] is not None \
            else None
        self.limit = (max_batch if batched else 1) + max_queue
        self.admitted = 0
        # for /metrics: worker requests queued and running, changed by the loop and the worker
        self.lock = threading.Lock()
        self.waiting = self.running = 0

    def under_adapter(self, adapter: str) -> Served:
        """The export as `NAME:ADAPTER`: the same sessions, scheduler, worker and prefix cache
        (keyed by adapter), its own admission count."""
        view = copy.copy(self)
        view.name, view.adapter = f"{self.name}:{adapter}", adapter
        view.admitted = 0
        return view

    def admit(self) -> None:
        """Count a request in, or refuse it (429) when running and waiting ones fill it."""
        if self.admitted >= self.limit:
            raise ApiError(429, f"{self.name}: the queue is full ({self.max_queue} waiting); "
                           "retry later", None, "queue_full")
        self.admitted += 1

    def generate(self, ids: list[int], options: GenerateOptions, sampled: Sampled,
                 constraint: Constraint | None = None, top: int | None = None) -> Ticket:
        """Queue a generation (on the event loop); its events come on the ticket. Its place is
        taken once the job is made and given back by its last event ("done", "gone" or
        "error", which every queued job gets), or here if queueing it fails. `top` not None:
        its tokens are scored, and a ("logprobs", [Scored]) event with those picked since the
        last comes before each piece of text and before "done"."""
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[Event] = asyncio.Queue()

        def deliver(event: Event) -> None:
            queue.put_nowait(event)
            if event[0] in ENDS:
                self.admitted -= 1

        def send(event: Event) -> None:  # from the scheduler's or the worker's thread
            with contextlib.suppress(RuntimeError):  # the loop closed: the server stopped,
                loop.call_soon_threadsafe(deliver, event)  # no one waits for this event

        def emit(event: Event) -> None:
            # as the text is sent, on the thread that picked its tokens: a piece carries the
            # scores of exactly the tokens picked before it
            if job.logprobs is not None and event[0] in ("piece", "done"):
                send(("logprobs", job.logprobs.unsent()))
            send(event)

        job = Job(ids, options.max_new_tokens, options.sampling(), sampled.stops,
                  sampled.stream, emit, constraint, adapter=self.adapter)
        self.admit()
        job.logprobs = None if top is None else Recorder(top)  # before it is queued
        try:
            if self.scheduler is not None:
                self.scheduler.submit(job)
            else:
                with self.lock:
                    self.waiting += 1
                self.worker.submit(self._alone, job, options)
        except BaseException:
            self.admitted -= 1
            raise
        return Ticket(queue, job)

    def _alone(self, job: Job, options: GenerateOptions) -> None:
        """An encoder-decoder's generation in the worker: whole, then sent in pieces."""
        with self.lock:
            self.waiting, self.running = self.waiting - 1, self.running + 1
        try:
            completion = self.complete(job.prompt, options, job.stops)
            job.first_token_at = time.perf_counter()
            for piece in self.deltas(completion) if job.stream else []:
                job.emit(("piece", piece))
            job.end(("done", completion))
        except Exception as exc:
            log_fault(LOG, "generation", exc)
            job.end(("error", "internal server error"))
        finally:
            with self.lock:
                self.running -= 1

    def check_scoring(self, top: int | None, field: str) -> None:
        """An encoder-decoder generates whole in the worker (runtime/exported.py), which
        scores nothing: log-probabilities are refused, naming the field that asks."""
        if top is not None and self.scheduler is None:
            raise ApiError(400, f"{field}: log-probabilities are served for decoder exports "
                           f"only ({self.name} is a {self.exported.card.family})", field,
                           "unsupported_value")

    async def score_prompt(self, ids: list[int], top: int, own_place: bool
                           ) -> list[Scored | None]:
        """The prompt's tokens scored (an echo's), in the worker thread; `own_place`: it takes
        a place in the queue of its own (no generation holds one for it)."""
        if own_place:
            self.admit()
        try:
            return await asyncio.wrap_future(self.worker.submit(
                prompt_scores, self.exported.runtime, ids, top, self.prefill_chunk,
                self.adapter))
        finally:
            if own_place:
                self.admitted -= 1

    async def transcribe(self, samples: np.ndarray, options: TranscribeOptions) -> Transcript:
        """A speech export's transcript of 16-kHz samples, in the worker thread, holding a
        place in the queue while it runs."""
        self.admit()
        try:
            return await asyncio.wrap_future(self.worker.submit(
                self.exported.transcribe, samples, options))
        finally:
            self.admitted -= 1

    async def embed_batched(self, prompts: list[list[int]]) -> list[list[float]]:
        """Sentence vectors of tokenized prompts, batched with other requests' by length."""
        assert self.embedder is not None, "model_of checked the card's pooling"
        self.admit()
        try:
            return (await asyncio.wrap_future(self.embedder.submit(prompts))).embeddings.tolist()
        finally:
            self.admitted -= 1

    async def embed_images(self, images: list[tuple[int, bytes]]) -> list[list[float]]:
        """A dual encoder's unit vectors of encoded images ((input index, bytes)), decoded as
        `zoo embed --images` decodes files, in the worker thread; a bad one is a 400 naming
        its input."""
        if not images:
            return []
        self.admit()
        try:
            return await asyncio.wrap_future(self.worker.submit(self._image_vectors, images))
        finally:
            self.admitted -= 1

    def _image_vectors(self, images: list[tuple[int, bytes]]) -> list[list[float]]:
        try:
            processor = export_processor(self.exported.folder, self.exported.card)
            pixels = np.stack([pixel_values(decoded_rgb(io.BytesIO(data), f"input[{i}].image"),
                                            processor, f"input[{i}].image")
                               for i, data in images])
        except ZooError as exc:
            raise ApiError(400, str(exc), "input", "invalid_value") from None
        return run_images(self.exported.runtime, pixels).embeddings.tolist()

    async def classify_batched(self, prompts: list[list[int]]) -> list[dict[str, float]]:
        """Per tokenized prompt, {label: probability}, the most likely first, as
        `zoo.load(OUT).classify` gives them; batched with other requests' as embeddings are."""
        assert self.embedder is not None, "a classifier has a sentence vector"
        self.admit()
        try:
            result = await asyncio.wrap_future(self.embedder.submit(prompts))
        finally:
            self.admitted -= 1
        assert result.probabilities is not None, "model_of checked the card's num_labels"
        rows = SequenceOutputs(result.embeddings, result.probabilities,
                               label_names(self.exported.card))
        return [dict(rows.top(row, len(rows.labels))) for row in range(len(prompts))]

    def gauges(self) -> tuple[int, int, int, int, int]:
        """(queue length, batch size, decoding steps, rows decoded, largest batch)."""
        with self.lock:
            worker = (self.waiting, self.running)
        if self.scheduler is None:
            return (*worker, 0, 0, 0)
        waiting, rows, steps, decoded, largest = self.scheduler.gauges()
        return waiting + worker[0], rows + worker[1], steps, decoded, largest

    def prompt_ids(self, prompt: str | list[int] | list[dict[str, Any]], param: str,
                   tools: list[dict[str, Any]] | None = None) -> list[int]:
        """A chat's ids in the export's template, or a prompt's as `zoo run --text` / `--ids`
        encode it; within the vocabulary and shorter than the context."""
        exported = self.exported
        try:
            if param == "messages":
                ids = exported.chat_prompt(prompt, tools)  # type: ignore[arg-type]
            elif isinstance(prompt, str):
                if exported.tokenizer is None:
                    raise ZooError(f"{self.name} has no tokenizer: send token ids")
                ids = sequence_ids(exported.tokenizer, check_text(prompt, param))
            else:
                ids = list(prompt)  # type: ignore[arg-type]
            limit = exported.card["max_positions"]
            if len(ids) >= limit:
                raise ApiError(400, f"{param}: {len(ids)} tokens leave no room in the context "
                               f"of {limit} tokens", param, "context_length_exceeded")
            exported.tokens(ids, param)  # each id in the vocabulary
        except ZooError as exc:
            raise ApiError(400, str(exc), param, "invalid_value") from None
        return ids

    def options(self, ids: list[int], sampled: Sampled) -> GenerateOptions:
        room = self.exported.card["max_positions"] - len(ids)
        wanted = room if sampled.max_tokens is None else sampled.max_tokens
        if wanted > room:
            raise ApiError(400, f"max_tokens: {len(ids)} prompt tokens and {wanted} new ones "
                           f"exceed the context of {room + len(ids)} tokens", "max_tokens",
                           "context_length_exceeded")
        seed = sampled.seed if sampled.seed is not None else secrets.randbelow(2**31)
        return GenerateOptions(max_new_tokens=wanted, temperature=sampled.temperature,
                               top_p=sampled.top_p, seed=seed)

    def complete(self, ids: list[int], options: GenerateOptions, stops: tuple[str, ...]
                 ) -> Completion:
        """Generate (in the worker thread): the tokens up to eos and their text, as `zoo run`
        decodes them, cut at the first stop string."""
        row = self.exported.generate([ids], options)[0].ids
        eos = self.exported.card["eos_token_id"]
        new = row[:row.index(eos) + 1] if eos in row else row
        text = self.text(new)
        cuts = [text.find(stop) for stop in stops if stop in text]
        if cuts:
            return Completion(len(ids), new, text[:min(cuts)], "stop")
        return Completion(len(ids), new, text, "stop" if eos in row else "length")

    def text(self, ids: list[int]) -> str:
        tokenizer = self.exported.tokenizer
        return tokenizer.decode(ids) if tokenizer is not None else ""

    def deltas(self, completion: Completion) -> list[str]:
        """The text in pieces as its tokens come, each decoded with those before it (a piece
        of a character waits for the rest); joined they are exactly the completion's text."""
        pieces, sent = [], ""
        for end in range(1, len(completion.ids) + 1):
            text = self.text(completion.ids[:end])
            if len(text) > len(sent) and completion.text.startswith(text):
                pieces.append(text[len(sent):])
                sent = text
        if len(completion.text) > len(sent):
            pieces.append(completion.text[len(sent):])
        return pieces

    def constraint(self, grammar: Grammar | None) -> Constraint | None:
        """A request's grammar state (in a thread: a large schema compiles for a while), or a
        400 naming the field that asked for it; only the batched decoders are constrained."""
        if grammar is None:
            return None
        field = grammar.where.split(".")[0]  # response_format or tools
        if self.scheduler is None:
            raise ApiError(400, f"{field}: a {self.exported.card.family} export's answers are "
                           "not constrained (decoders only)", field, "invalid_value")
        try:
            return self.exported.grammars.constraint(grammar)
        except ZooError as exc:
            raise ApiError(400, str(exc), field, "invalid_value") from None

    def embed_tokens(self, prompts: list[Any]) -> list[list[int]]:
        """Each input's token ids, as `zoo run --text --json` reads them."""
        try:
            return self.exported.tokens(prompts, "input", whole=True)
        except ZooError as exc:
            raise ApiError(400, str(exc), "input", "invalid_value") from None


def open_served(folders: Sequence[Path], names: Sequence[str], options: ServeOptions
                ) -> dict[str, Served]:
    """Each export opened under its name: what `zoo serve` serves, and each Ray replica."""
    models = {name: Served(name, load(folder, options.provider, options.threads),
                           options.max_queue, options.max_batch, options.prefill_chunk,
                           options.prefix_cache_mb)
              for name, folder in zip(names, folders, strict=True)}
    models.update(adapter_models(models[names[0]], Path(folders[0]), options.adapters))
    return models


def adapter_models(base: Served, folder: Path, specs: Sequence[str]) -> dict[str, Served]:
    """{BASE:NAME: the export under that adapter} for the export's own adapters and each
    `--adapter NAME=FILE`, every file read and checked against the graph's inputs first; a
    bad spec is one line, before anything is served."""
    runtime = base.exported.runtime
    adapters = runtime.adapters
    where = display_path(folder)
    if specs and not adapters.inputs:
        raise ZooError(f"--adapter: {where} was not exported with --adapters keep (its graphs "
                       "take no LoRA factors)")
    if specs and base.scheduler is None:
        raise ZooError(f"--adapter: {where} is not a decoder export (adapters are served for "
                       "generation)")
    for spec in specs:
        name, equals, file = spec.partition("=")
        if not equals or not ADAPTER_NAME.fullmatch(name) or not file:
            raise ZooError(f"--adapter {spec}: expected NAME=FILE (NAME in letters, digits, "
                           "'.', '_', '-')")
        adapters.add(name, Path(file))
    if base.scheduler is None:
        return {}
    return {f"{base.name}:{name}": base.under_adapter(name) for name in adapters.names}
