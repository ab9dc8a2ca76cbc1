"""The request side of OpenAI's `POST /v1/audio/transcriptions`: a multipart/form-data body
(the `openai` client's `audio.transcriptions.create`) read within a bound and checked field by
field; a wrong field is an ApiError naming it, as runtime/serve/bodies.py does for JSON bodies.

The body is never read unbounded: a declared Content-Length past the bound is refused before
any byte is read, and the stream itself is counted as it arrives (as app.py's read_body does
for JSON), so a chunked upload stops at the bound too. Starlette's multipart parser (which
needs python-multipart) keeps a file part in memory up to 1 MiB and in a temporary file past
that, and closes it when the form is closed."""

from __future__ import annotations

import math
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

from runtime.serve.errors import ApiError
from runtime.transcript import LANGUAGES, RESPONSE_FORMATS

MAX_AUDIO_BYTES = 25 * 2**20  # OpenAI's limit on an uploaded audio file (25 MB)
FIELD_BYTES = 64 * 2**10  # the other fields together (a prompt, the options) may add this
MAX_FIELDS = 32
GRANULARITIES = ("segment",)  # word timestamps are not computed
FIELDS = {"file", "model", "response_format", "language", "prompt", "temperature",
          "timestamp_granularities", "timestamp_granularities[]", "stream"}


@dataclass(frozen=True)
class TranscriptionForm:
    audio: bytes
    filename: str
    model: str
    response_format: str
    language: str | None
    prompt: str | None
    temperature: float
    timestamp_granularities: tuple[str, ...]


def too_large(max_bytes: int) -> ApiError:
    return ApiError(413, f"file: the upload is over {max_bytes} bytes", "file",
                    "file_too_large")


async def read_transcription_form(request: Any, max_bytes: int = MAX_AUDIO_BYTES
                                  ) -> TranscriptionForm:
    """The form of a Starlette request, its file at most `max_bytes` bytes."""
    from starlette.datastructures import UploadFile
    from starlette.formparsers import MultiPartException, MultiPartParser

    kind = request.headers.get("content-type", "")
    if not kind.lower().startswith("multipart/form-data"):
        raise ApiError(400, f"the body should be multipart/form-data, not {kind[:80]!r}", None,
                       "invalid_content_type")
    limit = max_bytes + FIELD_BYTES
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > limit:
        raise too_large(max_bytes)  # refused before a byte of the body is read
    parser = MultiPartParser(request.headers, _bounded(request, limit, max_bytes),
                             max_files=1, max_fields=MAX_FIELDS, max_part_size=FIELD_BYTES)
    try:
        form = await parser.parse()
    except MultiPartException as exc:
        raise ApiError(400, f"the body is not valid multipart/form-data ({exc.message})", None,
                       "invalid_multipart") from None
    try:
        fields = _fields(form)
        upload = form.get("file")
        if upload is None:
            raise ApiError(400, "file: a required field is missing", "file", "missing_required")
        if not isinstance(upload, UploadFile):
            raise ApiError(400, "file: expected an audio file (a file part, not text)", "file",
                           "invalid_type")
        audio = await upload.read()
        if len(audio) > max_bytes:
            raise too_large(max_bytes)
        return TranscriptionForm(audio, upload.filename or "file", *fields)
    finally:
        await form.close()


async def _bounded(request: Any, limit: int, max_bytes: int) -> AsyncIterator[bytes]:
    received = 0
    async for chunk in request.stream():
        received += len(chunk)
        if received > limit:
            raise too_large(max_bytes)
        yield chunk


def _fields(form: Any) -> tuple[str, str, str | None, str | None, float, tuple[str, ...]]:
    """model, response_format, language, prompt, temperature, timestamp_granularities."""
    unknown = sorted(set(form.keys()) - FIELDS)
    if unknown:
        raise ApiError(400, f"unrecognized request argument supplied: {unknown[0][:64]}",
                       unknown[0][:64], "unknown_parameter")
    if _text(form, "stream", "false").lower() != "false":
        raise ApiError(400, "stream: streamed transcriptions are not supported", "stream",
                       "unsupported_value")
    model = _text(form, "model", None)
    if not model:
        raise ApiError(400, "model: a required field is missing", "model", "missing_required")
    response_format = _text(form, "response_format", "json")
    if response_format not in RESPONSE_FORMATS:
        raise ApiError(400, f"response_format: {response_format[:40]!r} should be one of "
                       f"{', '.join(RESPONSE_FORMATS)}", "response_format", "invalid_value")
    language = _text(form, "language", "") or None
    if language is not None and language not in LANGUAGES:
        raise ApiError(400, f"language: {language[:40]!r} should be an ISO-639-1 code Whisper "
                       "knows (en, fr, de, ...)", "language", "invalid_value")
    prompt = _text(form, "prompt", "") or None
    return (model, response_format, language, prompt, _temperature(form),
            _granularities(form, response_format))


def _text(form: Any, name: str, default: str | None) -> Any:
    value = form.get(name)
    if value is None:
        return default
    if not isinstance(value, str):
        raise ApiError(400, f"{name}: expected text, not a file", name, "invalid_type")
    return value


def _temperature(form: Any) -> float:
    text = _text(form, "temperature", "0")
    try:
        temperature = float(text)
    except ValueError:
        temperature = math.nan
    if not 0.0 <= temperature <= 1.0:  # NaN fails too
        raise ApiError(400, f"temperature: {text[:40]!r} should be a number from 0 to 1",
                       "temperature", "invalid_value")
    return temperature


def _granularities(form: Any, response_format: str) -> tuple[str, ...]:
    """The openai client sends a list as repeated `timestamp_granularities[]` fields."""
    values = [value for name in ("timestamp_granularities", "timestamp_granularities[]")
              for value in form.getlist(name)]
    if not values:
        return GRANULARITIES
    for value in values:
        if value not in GRANULARITIES:
            raise ApiError(400, f"timestamp_granularities: {str(value)[:40]!r} is not supported "
                           f"(only {', '.join(GRANULARITIES)})", "timestamp_granularities",
                           "unsupported_value")
    if response_format != "verbose_json":
        raise ApiError(400, "timestamp_granularities: needs response_format verbose_json",
                       "timestamp_granularities", "invalid_value")
    return tuple(dict.fromkeys(values))
