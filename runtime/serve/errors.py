"""The error a request gets: an HTTP status and OpenAI's error object, which names the field."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


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
