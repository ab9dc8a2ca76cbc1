"""The error a request gets: an HTTP status and OpenAI's error object, which names the field."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from registry.errors import first_line


@dataclass
class ApiError(Exception):
    """A refused request: {"error": {"message", "type", "param", "code"}} with `status`."""

    status: int
    message: str
    param: str | None = None
    code: str | None = None

    @property
    def kind(self) -> str:
        return {401: "authentication_error", 404: "not_found_error", 413: "invalid_request_error",
                429: "rate_limit_error"}.get(self.status, "invalid_request_error"
                                             if self.status < 500 else "server_error")

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.kind, "param": self.param,
                          "code": self.code}}


def internal_error() -> ApiError:
    """What a client learns of a fault of the server: that it was one, nothing more."""
    return ApiError(500, "internal server error", None, "server_error")


def log_fault(log: logging.Logger, where: str, exc: BaseException) -> None:
    """A fault of the server (never of a request) as one line; its traceback at DEBUG, which
    `zoo serve --tracebacks` shows. The client gets a bare 500: no traceback leaves."""
    log.error("%s: internal error: %s: %s", where, type(exc).__name__, first_line(exc)[:300])
    log.debug("%s: the traceback", where, exc_info=exc)
