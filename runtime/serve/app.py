"""The OpenAI-compatible routes over served exports (runtime/serve/models.py):
POST /v1/chat/completions, /v1/completions, /v1/embeddings; GET /v1/models, /health (open to
all, for a load balancer; the /v1 routes need the API key when one is set).

Every refusal is OpenAI's error object naming the field, checked before any work is queued;
an unexpected fault is logged here with its traceback and reaches the client as one line.
One log line a request: method, path, status, tokens, milliseconds."""

from __future__ import annotations

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
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from runtime.serve import bodies
from runtime.serve.errors import ApiError
from runtime.serve.models import Completion, Served

LOG = logging.getLogger("zoo.serve")
Handler = Callable[[Request, dict[str, Served]], Awaitable[tuple[Response, int]]]


def make_app(models: dict[str, Served], api_key: str | None) -> Starlette:
    def route(path: str, handler: Handler, method: str, keyed: bool = True) -> Route:
        async def endpoint(request: Request) -> Response:
            start, tokens = time.perf_counter(), 0
            try:
                if keyed and api_key is not None and not authorized(request, api_key):
                    raise ApiError(401, "a valid API key is needed: send `Authorization: "
                                   "Bearer KEY`", None, "invalid_api_key")
                response, tokens = await handler(request, models)
            except ApiError as exc:
                response = JSONResponse(exc.body(), exc.status)
            except Exception:  # a fault of the server, never of the request: logged, not sent
                LOG.exception("%s %s: internal error", request.method, path)
                response = JSONResponse(ApiError(500, "internal server error").body(), 500)
            if isinstance(response, StreamingResponse):
                return response  # its stream logs its line when it ends
            log_line(request, response.status_code, tokens, start)
            return response
        return Route(path, endpoint, methods=[method])

    routes = [route("/v1/chat/completions", chat, "POST"),
              route("/v1/completions", completions, "POST"),
              route("/v1/embeddings", embeddings, "POST"),
              route("/v1/models", listing, "GET"),
              route("/health", health, "GET", keyed=False)]
    return Starlette(routes=routes, exception_handlers={HTTPException: http_error})


def authorized(request: Request, key: str) -> bool:
    given = request.headers.get("authorization", "")
    scheme, _, token = given.partition(" ")
    return scheme.lower() == "bearer" and hmac.compare_digest(token.strip().encode(),
                                                              key.encode())


async def http_error(request: Request, exc: Exception) -> Response:
    """Starlette's own refusals (an unknown path, a wrong method) as OpenAI error objects."""
    status = getattr(exc, "status_code", 400)
    log_line(request, status, 0, time.perf_counter())
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


def model_of(body: dict[str, Any], models: dict[str, Served], wants: str) -> Served:
    name = bodies.read(body, "model", str, ApiError, "a model's name (GET /v1/models)")
    if name not in models:
        raise ApiError(404, f"model: {name!r} is not served here (served: "
                       f"{', '.join(models)})", "model", "model_not_found")
    served = models[name]
    card, spec = served.exported.card, served.exported.runtime.spec
    if wants == "embeddings" and card["pooling"] is None:
        raise ApiError(400, f"model: {name} has no sentence vector (its card sets no pooling)",
                       "model", "invalid_value")
    if wants != "embeddings" and not spec.generates:
        raise ApiError(400, f"model: a {card.family} export does not generate", "model",
                       "invalid_value")
    return served


async def chat(request: Request, models: dict[str, Served]) -> tuple[Response, int]:
    body = await read_body(request, "chat")
    served = model_of(body, models, "chat")
    sampled = bodies.sampled(body)
    ids = served.prompt_ids(bodies.messages(body), "messages")
    return await answer(served, ids, sampled, "chat.completion")


async def completions(request: Request, models: dict[str, Served]) -> tuple[Response, int]:
    body = await read_body(request, "completions")
    served = model_of(body, models, "completions")
    sampled = bodies.sampled(body)
    ids = served.prompt_ids(bodies.prompt(body), "prompt")
    return await answer(served, ids, sampled, "text_completion")


async def answer(served: Served, ids: list[int], sampled: bodies.Sampled, kind: str
                 ) -> tuple[Response, int]:
    options = served.options(ids, sampled)

    def work() -> tuple[Completion, list[str]]:  # the stream's pieces decoded off the loop too
        completion = served.complete(ids, options, sampled.stops)
        return completion, served.deltas(completion) if sampled.stream else []

    completion, pieces = await served.run(work)
    head = {"id": f"{'chatcmpl' if kind == 'chat.completion' else 'cmpl'}-{uuid.uuid4().hex}",
            "created": int(time.time()), "model": served.name}
    tokens = completion.usage()["total_tokens"]
    if sampled.stream:
        return StreamingResponse(events(completion, pieces, kind, head),
                                 media_type="text/event-stream",
                                 headers={"Cache-Control": "no-cache"}), tokens
    if kind == "chat.completion":
        choice = {"index": 0, "message": {"role": "assistant", "content": completion.text},
                  "finish_reason": completion.finish_reason, "logprobs": None}
    else:
        choice = {"index": 0, "text": completion.text, "finish_reason":
                  completion.finish_reason, "logprobs": None}
    return JSONResponse({**head, "object": kind, "choices": [choice],
                         "usage": completion.usage()}), tokens


async def events(completion: Completion, pieces: list[str], kind: str, head: dict[str, Any]
                 ) -> AsyncIterator[str]:
    """Server-Sent Events: the text in pieces, the finish reason, a last chunk with the usage
    and no choices (as OpenAI's stream_options.include_usage), then [DONE]."""
    start, status = time.perf_counter(), "done"
    chat_kind = kind == "chat.completion"
    kind = "chat.completion.chunk" if chat_kind else "text_completion"

    def chunk(piece: str | None, finish: str | None = None, role: bool = False) -> str:
        if chat_kind:
            delta: dict[str, str] = {"role": "assistant"} if role else {}
            if piece is not None:
                delta["content"] = piece
            choice: dict[str, Any] = {"index": 0, "delta": delta}
        else:
            choice = {"index": 0, "text": piece or ""}
        choice.update(finish_reason=finish, logprobs=None)
        return sse({**head, "object": kind, "choices": [choice]})

    try:
        if chat_kind:
            yield chunk("", role=True)
        for piece in pieces:
            yield chunk(piece)
        yield chunk(None, completion.finish_reason)
        yield sse({**head, "object": kind, "choices": [], "usage": completion.usage()})
        yield "data: [DONE]\n\n"
    except BaseException:
        status = "client gone"
        raise
    finally:
        LOG.info("POST %s 200 %d tokens %.0f ms (stream %s)", "/v1/" + (
            "chat/completions" if chat_kind else "completions"),
            completion.usage()["total_tokens"], (time.perf_counter() - start) * 1000, status)


def sse(data: dict[str, Any]) -> str:
    return f"data: {json.dumps(data)}\n\n"


async def embeddings(request: Request, models: dict[str, Served]) -> tuple[Response, int]:
    body = await read_body(request, "embeddings")
    served = model_of(body, models, "embeddings")
    prompts = bodies.inputs(body)
    vectors, tokens = await served.run(lambda: served.embed(prompts))
    if body.get("encoding_format") == "base64":  # the openai client's default: float32 bytes
        vectors = [base64.b64encode(np.asarray(row, np.float32).tobytes()).decode()
                   for row in vectors]
    data = [{"object": "embedding", "index": index, "embedding": vector}
            for index, vector in enumerate(vectors)]
    return JSONResponse({"object": "list", "data": data, "model": served.name,
                         "usage": {"prompt_tokens": tokens, "total_tokens": tokens}}), tokens


async def listing(request: Request, models: dict[str, Served]) -> tuple[Response, int]:
    data = [{"id": name, "object": "model", "created": 0, "owned_by": "zoo"} for name in models]
    return JSONResponse({"object": "list", "data": data}), 0


async def health(request: Request, models: dict[str, Served]) -> tuple[Response, int]:
    return JSONResponse({"status": "ok", "models": list(models)}), 0
