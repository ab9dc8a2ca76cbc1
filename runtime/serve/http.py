"""What reaches the client when the request is not one the app can see, or the app fails: the
same JSON error object as every other refusal (runtime/serve/errors.py).

- `JsonErrorsH11`: uvicorn's h11 protocol, which refuses what h11 cannot parse (a header
  section past MAX_HEADER_BYTES: a long URL, a huge header, thousands of headers; a malformed
  request line; bytes left over after a body) with a plain-text 400 of its own. Here the
  refusal is the JSON object, with h11's status hint (431 for a header section too large).
  Chosen over documenting a reverse proxy's setting: the server answers strangers itself.
- `Guard`: an exception that escapes the routes (one raised while a stream is sent, or
  by Starlette itself) is one log line (runtime/serve/errors.py `log_fault`), a JSON 500 when
  no response has started, and never uvicorn's "Exception in ASGI application" traceback."""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from typing import Any

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

from runtime.serve.errors import ApiError, internal_error, log_fault

LOG = logging.getLogger("zoo.serve")
MAX_HEADER_BYTES = 16 * 1024  # the request line and headers together (h11's default)
LINGER = 2.0  # seconds a refused connection may go on sending before it is closed
ASGIApp = Callable[..., Any]


def error_bytes(status: int, message: str, code: str) -> bytes:
    return json.dumps(ApiError(status, message, None, code).body()).encode()


def header_bytes(request: h11.Request) -> int:
    """The size of a request's header section as sent (line ends and separators counted)."""
    line = len(request.method) + len(request.target) + len(b"  HTTP/1.1\r\n")
    return line + sum(len(name) + len(value) + 4 for name, value in request.headers) + 2


class JsonErrorsH11(H11Protocol):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.refusal: h11.RemoteProtocolError | None = None
        self.refused = False  # answered a refusal: what the client still sends is dropped
        parse = self.conn.next_event  # the one connection object, reused for every request

        def next_event() -> Any:
            try:
                event = parse()
                if isinstance(event, h11.Request) and header_bytes(event) > MAX_HEADER_BYTES:
                    # h11 bounds only a section still incomplete: one that arrived whole in
                    # one read passes its limit, so the limit is held here as well
                    raise h11.RemoteProtocolError("header section too large", 431)
                return event
            except h11.RemoteProtocolError as exc:
                self.refusal = exc  # for send_400_response, which is told only a fixed text
                raise

        self.conn.next_event = next_event  # type: ignore[method-assign]

    def send_400_response(self, msg: str) -> None:
        status = getattr(self.refusal, "error_status_hint", 400)
        if status == 431:
            message = f"the request's header section is over {MAX_HEADER_BYTES} bytes"
            code = "headers_too_large"
        else:
            said = str(self.refusal or "")[:120]
            message, code = f"the request is not valid HTTP/1.1 ({said})", "invalid_http"
        body = error_bytes(status, message, code)
        headers = [(b"content-type", b"application/json"),
                   (b"content-length", str(len(body)).encode()), (b"connection", b"close")]
        for event in (h11.Response(status_code=status, headers=headers),
                      h11.Data(data=body), h11.EndOfMessage()):
            self.transport.write(self.conn.send(event))
        # A lingering close: closing with the client's bytes unread would send a reset that
        # can destroy this answer before the client reads it (it is still sending its 1 MB
        # header). So: end our side, drop what still comes, close at the client's end or
        # after LINGER seconds.
        self.refused = True
        if self.transport.can_write_eof():
            self.transport.write_eof()
            self.loop.call_later(LINGER, self.transport.close)
        else:
            self.transport.close()

    def data_received(self, data: bytes) -> None:
        if not self.refused:
            super().data_received(data)


class Guard:
    """Starlette middleware (inside its ServerErrorMiddleware, which would send plain text
    and re-raise the exception for uvicorn to log with its traceback)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        started = False

        async def tracking(message: dict[str, Any]) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, receive, tracking)
        except Exception as exc:
            log_fault(LOG, f"{scope.get('method', '')} {scope.get('path', '')}", exc)
            if scope["type"] == "http" and not started:
                body = json.dumps(internal_error().body()).encode()
                await send({"type": "http.response.start", "status": 500,
                            "headers": [(b"content-type", b"application/json"),
                                        (b"content-length", str(len(body)).encode())]})
                await send({"type": "http.response.body", "body": body})
