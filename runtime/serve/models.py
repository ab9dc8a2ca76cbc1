"""One served export: its generation, embedding and classifying work, run in the export's own
worker thread one request at a time, behind a bounded count of admitted requests (429 past it)."""

from __future__ import annotations

import asyncio
import secrets
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, TypeVar

from registry.errors import ZooError
from runtime.exported import Exported, GenerateOptions
from runtime.files.tokenizer import sequence_ids
from runtime.prompts import check_text
from runtime.serve.bodies import Sampled
from runtime.serve.errors import ApiError

T = TypeVar("T")


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


class Served:
    """An export under its name; `admitted` counts its requests running or waiting."""

    def __init__(self, name: str, exported: Exported, max_queue: int) -> None:
        self.name, self.exported, self.max_queue = name, exported, max_queue
        self.worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"serve-{name}")
        self.admitted = 0
        # for /metrics: requests queued and running, changed by the loop and the worker
        self.lock = threading.Lock()
        self.waiting = self.running = 0

    async def run(self, work: Callable[[], T]) -> T:
        """`work` in the worker thread once the requests before it are done; 429 when the
        running one and max_queue waiting fill it. The count drops when the work ends, not
        when a client leaves, so a gone client's work still holds its place while it runs."""
        if self.admitted > self.max_queue:
            raise ApiError(429, f"{self.name}: the queue is full ({self.max_queue} waiting); "
                           "retry later", None, "queue_full")
        loop = asyncio.get_running_loop()
        self.admitted += 1
        with self.lock:
            self.waiting += 1

        def job() -> T:
            with self.lock:
                self.waiting, self.running = self.waiting - 1, self.running + 1
            try:
                return work()
            finally:
                with self.lock:
                    self.running -= 1

        future = self.worker.submit(job)
        future.add_done_callback(lambda _: loop.call_soon_threadsafe(self._release))
        return await asyncio.wrap_future(future)

    def gauges(self) -> tuple[int, int]:
        """(queue length, batch size): one request runs at a time for now."""
        with self.lock:
            return self.waiting, self.running

    def _release(self) -> None:
        self.admitted -= 1

    def prompt_ids(self, prompt: str | list[int] | list[dict[str, str]], param: str) -> list[int]:
        """A chat's ids in the export's template, or a prompt's as `zoo run --text` / `--ids`
        encode it; within the vocabulary and shorter than the context."""
        exported = self.exported
        try:
            if param == "messages":
                ids = exported.chat_prompt(prompt)  # type: ignore[arg-type]
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
        wanted = sampled.max_tokens or room
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

    def embed(self, prompts: list[Any]) -> tuple[list[list[float]], int]:
        """(vectors, prompt tokens), as `zoo run --text --json` computes them."""
        try:
            tokens = sum(len(ids) for ids in self.exported.tokens(prompts, "input", whole=True))
            vectors = self.exported.sequences(prompts, "input").embeddings
        except ZooError as exc:
            raise ApiError(400, str(exc), "input", "invalid_value") from None
        return vectors.tolist(), tokens

    def classify(self, texts: list[str]) -> tuple[list[dict[str, float]], int]:
        """({label: probability}, most likely first, per text; prompt tokens), as
        `zoo.load(OUT).classify` and `zoo run --text --json` compute them."""
        try:
            tokens = sum(len(ids) for ids in self.exported.tokens(texts, "input", whole=True))
            return self.exported.classify(texts), tokens
        except ZooError as exc:
            raise ApiError(400, str(exc), "input", "invalid_value") from None
