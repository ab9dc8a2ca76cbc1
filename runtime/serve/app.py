"""The OpenAI-compatible routes over served exports (runtime/serve/models.py):
POST /v1/chat/completions, /v1/completions, /v1/embeddings, /v1/classify (ours: OpenAI has no
classifier route), /v1/audio/transcriptions (a speech export's, multipart); GET /v1/models,
/health (open to all, for a load balancer) and /metrics (behind the API key when one is set,
unless `--public-metrics`; the /v1 routes need the key).

Every refusal is OpenAI's error object naming the field, checked before any work is queued;
an unexpected fault is one log line (its traceback with `--tracebacks`) and reaches the client
as a bare 500, and the server keeps serving. A chat's template and a prompt's tokens are made
in a thread, off the event loop. One log line a request: method, path, status, tokens,
milliseconds. docs/serve.md lists every limit and what a client gets past it; log-probabilities
(`logprobs`, `top_logprobs`, `echo`) are shaped by runtime/serve/logprobs.py."""

from __future__ import annotations

import asyncio
import base64
import hmac
import json
import logging
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import numpy as np
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from registry.errors import ZooError, first_line
from registry.stems import is_mel_card
from runtime.files.audio import decode_audio
from runtime.files.tools import CallStream, split_calls
from runtime.grammar.engine import Constraint
from runtime.serve import bodies
from runtime.serve.errors import ApiError, internal_error, log_fault
from runtime.serve.http import Guard
from runtime.serve.logprobs import Shaper, joined
from runtime.serve.metrics import Metrics
from runtime.serve.models import Served, Ticket
from runtime.serve.scheduler import Completion, Event
from runtime.serve.tools import call_grammar, read_tools
from runtime.serve.transcriptions import read_transcription_form
from runtime.speech_tokens import SpeechTokensError
from runtime.transcribe import TranscribeOptions
from runtime.transcript import TIMED_FORMATS, format_transcript

LOG = logging.getLogger("zoo.serve")
Handler = Callable[[Request, dict[str, Served]], Awaitable[tuple[Response, int]]]


def make_app(models: dict[str, Served], api_key: str | None, public_metrics: bool = False
             ) -> Starlette:
    def route(path: str, handler: Handler, method: str, keyed: bool = True) -> Route:
        async def endpoint(request: Request) -> Response:
            start, tokens = time.perf_counter(), 0
            request.state.start, request.state.model = start, ""
            try:
                if keyed and api_key is not None and not authorized(request, api_key):
                    raise ApiError(401, "a valid API key is needed: send `Authorization: "
                                   "Bearer KEY`", None, "invalid_api_key")
                response, tokens = await handler(request, models)
            except ApiError as exc:
                response = JSONResponse(exc.body(), exc.status)
            except Exception as exc:  # a fault of the server, never of the request
                log_fault(LOG, f"{request.method} {path}", exc)
                response = JSONResponse(internal_error().body(), 500)
            # the model's label only once it names a served export: a client's made-up names
            # never become series of their own
            metrics.request(request.state.model, path, response.status_code)
            if isinstance(response, StreamingResponse):
                return response  # its stream logs its line when it ends
            log_line(request, response.status_code, tokens, start)
            return response
        return Route(path, endpoint, methods=[method])

    routes = [route("/v1/chat/completions", chat, "POST"),
              route("/v1/completions", completions, "POST"),
              route("/v1/embeddings", embeddings, "POST"),
              route("/v1/classify", classify, "POST"),
              route("/v1/audio/transcriptions", transcriptions, "POST"),
              route("/v1/models", listing, "GET"),
              route("/health", health, "GET", keyed=False),
              # the figures tell a stranger how busy the server is and what its clients
              # send; Prometheus sends the key as `authorization: {credentials: KEY}`
              route("/metrics", scrape, "GET", keyed=not public_metrics)]
    metrics = Metrics()
    app = Starlette(routes=routes, middleware=[Middleware(Guard)],
                    exception_handlers={HTTPException: http_error})
    app.state.metrics = metrics
    return app


def authorized(request: Request, key: str) -> bool:
    """`Authorization: Bearer KEY`, the key's bytes exactly (nothing stripped: a key and a
    no-break space is another key), compared in constant time."""
    given = request.headers.get("authorization", "").encode("latin-1")  # the bytes sent
    scheme, _, token = given.partition(b" ")
    return scheme.lower() == b"bearer" and hmac.compare_digest(token, key.encode())


async def http_error(request: Request, exc: Exception) -> Response:
    """Starlette's own refusals (an unknown path, a wrong method) as OpenAI error objects."""
    status = getattr(exc, "status_code", 400)
    log_line(request, status, 0, time.perf_counter())
    request.app.state.metrics.request("", "other", status)  # not the path: a client's words
    return JSONResponse(ApiError(status, f"{request.method} {request.url.path}: "
                                 f"{getattr(exc, 'detail', '')}").body(), status)


def log_line(request: Request, status: int, tokens: int, start: float) -> None:
    LOG.info("%s %s %d %d tokens %.0f ms", request.method, request.url.path, status, tokens,
             (time.perf_counter() - start) * 1000)


async def read_body(request: Request, route: str) -> dict[str, Any]:
    """The body as a JSON object, refused past MAX_BODY bytes before reading it all."""
    declared = request.headers.get("content-length", "0")
    if declared.isdigit() and int(declared) > bodies.MAX_BODY:
        raise ApiError(413, f"the body is over {bodies.MAX_BODY} bytes", None, "body_too_large")
    raw = bytearray()
    async for chunk in request.stream():
        raw += chunk
        if len(raw) > bodies.MAX_BODY:
            raise ApiError(413, f"the body is over {bodies.MAX_BODY} bytes", None,
                           "body_too_large")
    return bodies.parse_body(bytes(raw), route)


def model_of(request: Request, body: dict[str, Any], models: dict[str, Served], wants: str
             ) -> Served:
    name = bodies.read(body, "model", str, ApiError, "a model's name (GET /v1/models)")
    if name not in models:
        raise ApiError(404, f"model: {name!r} is not served here (served: "
                       f"{', '.join(models)})", "model", "model_not_found")
    served = models[name]
    request.state.model = name
    card, spec = served.exported.card, served.exported.runtime.spec
    if wants == "embeddings" and card["pooling"] is None:
        raise ApiError(400, f"model: {name} has no sentence vector (its card sets no pooling)",
                       "model", "invalid_value")
    if wants == "classify" and not card["num_labels"]:
        raise ApiError(400, f"model: {name} is not a classifier (its card sets no num_labels)",
                       "model", "invalid_value")
    if wants in ("chat", "completions") and is_mel_card(card):
        raise ApiError(400, f"model: {name} is a speech model: POST /v1/audio/transcriptions",
                       "model", "invalid_value")
    if wants in ("chat", "completions") and not spec.generates:
        raise ApiError(400, f"model: a {card.family} export does not generate", "model",
                       "invalid_value")
    return served


async def chat(request: Request, models: dict[str, Served]) -> tuple[Response, int]:
    body = await read_body(request, "chat")
    served = model_of(request, body, models, "chat")
    sampled, scoring = bodies.sampled(body), bodies.scoring(body, "chat")
    served.check_scoring(scoring.top, "logprobs")
    grammar = bodies.response_format(body)
    tools = read_tools(body)
    calls = tools is not None and tools.choice != "none"
    if tools is not None and calls:
        if grammar is not None:
            raise ApiError(400, "response_format: cannot be combined with tools (send "
                           'tool_choice "none" for an answer in a format)', "response_format",
                           "invalid_value")
        grammar = call_grammar(tools)
    shown = tools.tools if tools is not None else None
    ids = await asyncio.to_thread(served.prompt_ids, bodies.messages(body), "messages", shown)
    constraint = await asyncio.to_thread(served.constraint, grammar)
    return await answer(request, served, ids, sampled, "chat.completion", scoring,
                        constraint=constraint, calls=calls)


async def completions(request: Request, models: dict[str, Served]) -> tuple[Response, int]:
    body = await read_body(request, "completions")
    served = model_of(request, body, models, "completions")
    sampled, scoring = bodies.sampled(body), bodies.scoring(body, "completions")
    served.check_scoring(scoring.top, "logprobs")
    prompt = bodies.prompt(body)
    ids = await asyncio.to_thread(served.prompt_ids, prompt, "prompt")
    # echo: the prompt as sent (a text), or its ids' text
    echoed = (prompt if isinstance(prompt, str) else served.text(ids)) if scoring.echo else None
    return await answer(request, served, ids, sampled, "text_completion", scoring, echoed)


async def answer(request: Request, served: Served, ids: list[int], sampled: bodies.Sampled,
                 kind: str, scoring: bodies.Scoring, echoed: str | None = None,
                 constraint: Constraint | None = None, calls: bool = False
                 ) -> tuple[Response, int]:
    """Generate (max_tokens 0: nothing, an echo's prompt alone) and answer whole or as a
    stream; an echoed prompt with logprobs is scored first, under the generation's place in
    the queue (or a place of its own); `calls`: tool calls are parsed out of the answer."""
    options = served.options(ids, sampled)
    # 429 when full, before any work
    ticket = served.generate(ids, options, sampled, constraint, scoring.top) \
        if options.max_new_tokens else None
    shaper = Shaper(served.token_texts, kind == "chat.completion", scoring.top is not None)
    prefix = None  # the echoed prompt: its text and its logprobs
    if echoed is not None:
        try:
            scores = None if scoring.top is None else \
                await served.score_prompt(ids, scoring.top, own_place=ticket is None)
        except BaseException:
            if ticket is not None:
                ticket.cancel()
            raise
        prefix = echoed, shaper.prompt(ids, scores, echoed)
    head = {"id": f"{'chatcmpl' if kind == 'chat.completion' else 'cmpl'}-{uuid.uuid4().hex}",
            "created": int(time.time()), "model": served.name}
    nothing = Completion(len(ids), [], "", "length")  # max_tokens 0
    if sampled.stream:
        source = ticket.events() if ticket is not None else finished(nothing)
        return StreamingResponse(events(request, served, ticket, source, kind, head, shaper,
                                        prefix, calls),
                                 media_type="text/event-stream",
                                 headers={"Cache-Control": "no-cache"}), 0
    completion = nothing
    if ticket is not None:
        watcher = asyncio.ensure_future(cancel_when_gone(request, ticket))
        try:
            completion = await ticket.completion()
        finally:
            watcher.cancel()
    answered(request, served, ticket, completion)
    recorder = ticket.job.logprobs if ticket is not None else None
    logprobs = shaper.shaped(recorder.entries if recorder is not None else [])
    if kind == "chat.completion":
        message, finish = assistant(completion, calls)
        choice = {"index": 0, "message": message, "finish_reason": finish,
                  "logprobs": logprobs}
    else:
        text = completion.text
        if prefix is not None:  # echo: the prompt's text and values before the answer's
            text, logprobs = prefix[0] + text, joined(prefix[1], logprobs)
        choice = {"index": 0, "text": text, "finish_reason": completion.finish_reason,
                  "logprobs": logprobs}
    return JSONResponse({**head, "object": kind, "choices": [choice],
                         "usage": completion.usage()}), completion.usage()["total_tokens"]


def assistant(completion: Completion, calls: bool) -> tuple[dict[str, Any], str]:
    """The assistant's message and finish reason: its tool calls parsed out of a whole
    answer (finish_reason "tool_calls"), else its text."""
    if calls and completion.finish_reason == "stop":
        content, tool_calls = split_calls(completion.text)
        if tool_calls:
            return {"role": "assistant", "content": content, "tool_calls": tool_calls}, \
                "tool_calls"
    return {"role": "assistant", "content": completion.text}, completion.finish_reason


async def finished(completion: Completion) -> AsyncIterator[Event]:
    """The events of an answer with nothing to generate."""
    yield "done", completion


async def cancel_when_gone(request: Request, ticket: Ticket) -> None:
    """A non-streaming client that hangs up while its answer is generated: the server hears
    it as the request's next message (the body is read), and its row leaves at the next step
    as a stream's does."""
    while (await request.receive())["type"] != "http.disconnect":
        pass
    ticket.cancel()


def answered(request: Request, served: Served, ticket: Ticket | None, completion: Completion
             ) -> None:
    """Time to first token (from the request's arrival to its first token picked) and the
    tokens, once the answer is complete."""
    metrics: Metrics = request.app.state.metrics
    if ticket is not None:  # something was generated
        metrics.first_token(served.name, ticket.job.first_token_at - request.state.start)
    metrics.counted(served.name, completion.prompt_tokens, len(completion.ids))


async def events(request: Request, served: Served, ticket: Ticket | None,
                 source: AsyncIterator[Event], kind: str, head: dict[str, Any], shaper: Shaper,
                 prefix: tuple[str, dict[str, Any] | None] | None, calls: bool = False
                 ) -> AsyncIterator[str]:
    """Server-Sent Events: the echoed prompt, the text in pieces as its tokens are decoded
    (each with the logprobs of the tokens picked since the last), the finish reason, a last
    chunk with the usage and no choices (as OpenAI's stream_options.include_usage), then
    [DONE]. A client gone cancels this generator: its row leaves the batch at the next step.
    With tools (`calls`), an answer that begins a call is sent as OpenAI streams calls: per
    call its index, id and name, then its arguments' text as it is decoded."""
    start, status, tokens = time.perf_counter(), "done", 0
    chat_kind = kind == "chat.completion"
    kind = "chat.completion.chunk" if chat_kind else "text_completion"

    def chunk(piece: str | None, finish: str | None = None, role: bool = False,
              logprobs: dict[str, Any] | None = None,
              tool_calls: list[dict[str, Any]] | None = None) -> str:
        if chat_kind:
            delta: dict[str, Any] = {"role": "assistant"} if role else {}
            if piece is not None:
                delta["content"] = piece
            if tool_calls is not None:
                delta["tool_calls"] = tool_calls
            choice: dict[str, Any] = {"index": 0, "delta": delta}
        else:
            choice = {"index": 0, "text": piece or ""}
        choice.update(finish_reason=finish, logprobs=logprobs)
        return sse({**head, "object": kind, "choices": [choice]})

    try:
        if chat_kind:
            yield chunk("", role=True)
        if prefix is not None:
            yield chunk(prefix[0], logprobs=prefix[1])
        scored = []  # the tokens picked since the last chunk
        # with tools, an answer that begins with "<" is calls: their deltas instead of text
        held, holding, stream = "", calls, CallStream()
        async for name, value in source:
            if name == "logprobs":
                scored += value
                continue
            if name == "piece" and holding and (held + value)[:1] in ("<", ""):
                held += value
                for delta in stream.deltas(held):
                    yield chunk(None, tool_calls=[delta])
                continue  # its logprobs go with the next text, or the last chunk
            logprobs = shaper.shaped(scored) if scored else None
            scored = []
            if name == "piece":
                holding = False
                yield chunk(held + value, logprobs=logprobs)
                held = ""
            elif name == "done":
                answered(request, served, ticket, value)
                tokens = value.usage()["total_tokens"]
                message, finish = assistant(value, calls)
                if holding and held.startswith("<"):
                    for delta in stream.deltas(value.text, final=True):
                        yield chunk(None, tool_calls=[delta])
                    if not stream.sent:  # no call begun after all: the text as it is
                        yield chunk(value.text)
                elif held:
                    yield chunk(held)
                yield chunk(None, finish, logprobs=logprobs)
                yield sse({**head, "object": kind, "choices": [], "usage": value.usage()})
                yield "data: [DONE]\n\n"
            else:  # the headers are sent: the fault can only be told in the stream
                status = "failed"
                yield STREAM_FAULT
    except Exception as exc:  # a fault here, after the headers: told in the stream as well
        status = "failed"
        log_fault(LOG, "stream", exc)
        yield STREAM_FAULT
    except BaseException:
        status = "client gone"
        raise
    finally:
        if ticket is not None:
            ticket.cancel()  # no-op when it ended
        LOG.info("POST %s 200 %d tokens %.0f ms (stream %s)", "/v1/" + (
            "chat/completions" if chat_kind else "completions"), tokens,
            (time.perf_counter() - start) * 1000, status)


def sse(data: dict[str, Any]) -> str:
    return f"data: {json.dumps(data)}\n\n"


# made once: the event that tells a stream's client of a fault cannot fail to be made
STREAM_FAULT = sse(internal_error().body())


async def embeddings(request: Request, models: dict[str, Served]) -> tuple[Response, int]:
    body = await read_body(request, "embeddings")
    served = model_of(request, body, models, "embeddings")
    items = bodies.multimodal_inputs(body)
    if items is not None:
        prompts, vectors = await multimodal_vectors(served, items)
    else:
        prompts = await asyncio.to_thread(served.embed_tokens, bodies.inputs(body))
        vectors = await served.embed_batched(prompts)
    tokens = sum(len(row) for row in prompts)
    request.app.state.metrics.counted(served.name, tokens, 0)
    if body.get("encoding_format") == "base64":  # the openai client's default: float32 bytes
        vectors = [base64.b64encode(np.asarray(row, np.float32).tobytes()).decode()
                   for row in vectors]
    data = [{"object": "embedding", "index": index, "embedding": vector}
            for index, vector in enumerate(vectors)]
    return JSONResponse({"object": "list", "data": data, "model": served.name,
                         "usage": {"prompt_tokens": tokens, "total_tokens": tokens}}), tokens


async def multimodal_vectors(served: Served, items: list[tuple[str, Any]]
                             ) -> tuple[list[list[int]], list[list[float]]]:
    """(the texts' token ids, every item's vector in input order): the texts batched as other
    requests' texts are, the images run in the worker thread."""
    if not served.exported.runtime.spec.joint_space:
        raise ApiError(400, f"model: {served.name} reads no images (a CLIP or SigLIP export "
                       "embeds {\"image\": ...} inputs)", "model", "invalid_value")
    texts = [value for kind, value in items if kind == "text"]
    images = [(index, value) for index, (kind, value) in enumerate(items) if kind == "image"]
    prompts = await asyncio.to_thread(served.embed_tokens, texts) if texts else []
    text_vectors = iter(await served.embed_batched(prompts) if prompts else [])
    image_vectors = iter(await served.embed_images(images))
    return prompts, [next(text_vectors if kind == "text" else image_vectors)
                     for kind, _ in items]


async def classify(request: Request, models: dict[str, Served]) -> tuple[Response, int]:
    """Our own route for a classifier export: per text its most likely label and every
    label's probability (most likely first), as `zoo.load(OUT).classify` gives them."""
    body = await read_body(request, "classify")
    served = model_of(request, body, models, "classify")
    prompts = await asyncio.to_thread(served.embed_tokens, bodies.texts(body))
    tokens = sum(len(row) for row in prompts)
    rows = await served.classify_batched(prompts)
    request.app.state.metrics.counted(served.name, tokens, 0)
    data = [{"object": "classification", "index": index, "label": next(iter(row)),
             "probabilities": row} for index, row in enumerate(rows)]
    return JSONResponse({"object": "list", "data": data, "model": served.name,
                         "usage": {"prompt_tokens": tokens, "total_tokens": tokens}}), tokens


async def transcriptions(request: Request, models: dict[str, Served]) -> tuple[Response, int]:
    """OpenAI's speech to text over a speech export (Whisper): the multipart form read within
    its bound (runtime/serve/transcriptions.py), the upload decoded as `zoo run --audio` reads
    a file, the transcript in the form's response_format (srt, vtt and verbose_json with
    timestamps). Greedy only, without a prompt."""
    form = await read_transcription_form(request)
    if form.model not in models:
        raise ApiError(404, f"model: {form.model!r} is not served here (served: "
                       f"{', '.join(models)})", "model", "model_not_found")
    served = models[form.model]
    request.state.model = form.model
    if not is_mel_card(served.exported.card):
        raise ApiError(400, f"model: {form.model} is not a speech model (its card's stem reads "
                       "no audio)", "model", "invalid_value")
    if form.temperature:
        raise ApiError(400, "temperature: only greedy decoding (0) is served", "temperature",
                       "unsupported_value")
    if form.prompt:
        raise ApiError(400, "prompt: conditioning on earlier text is not supported", "prompt",
                       "unsupported_value")
    timestamps = form.response_format in TIMED_FORMATS
    options = TranscribeOptions(language=form.language, timestamps=timestamps)
    try:
        samples = await asyncio.to_thread(decode_audio, form.audio, form.filename)
    except ZooError as exc:  # not audio, truncated, too long, not finite
        raise ApiError(400, first_line(exc), "file", "invalid_value") from None
    try:
        transcript = await served.transcribe(samples, options)
    except SpeechTokensError as exc:  # a language the model has no token for
        raise ApiError(400, first_line(exc), "language", "unsupported_value") from None
    body, media_type = format_transcript(transcript, form.response_format)
    return Response(body, media_type=media_type), 0


async def listing(request: Request, models: dict[str, Served]) -> tuple[Response, int]:
    data = [{"id": name, "object": "model", "created": 0, "owned_by": "zoo"} for name in models]
    return JSONResponse({"object": "list", "data": data}), 0


async def health(request: Request, models: dict[str, Served]) -> tuple[Response, int]:
    return JSONResponse({"status": "ok", "models": list(models)}), 0


async def scrape(request: Request, models: dict[str, Served]) -> tuple[Response, int]:
    return Response(exposition(request.app.state.metrics, models),
                    media_type="text/plain; version=0.0.4; charset=utf-8"), 0


def exposition(metrics: Metrics, models: dict[str, Served]) -> str:
    """GET /metrics's text (also copied into Ray's metrics by each Ray replica)."""
    return metrics.text(((name, *served.gauges()) for name, served in models.items()),
                        [(name, *served.prefix_cache.stats()) for name, served in models.items()
                         if served.prefix_cache is not None])
