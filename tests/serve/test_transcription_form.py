"""The request side of `POST /v1/audio/transcriptions` (runtime/serve/transcriptions.py),
read by a tiny Starlette app in this file and sent by the `openai` client's
`audio.transcriptions.create` (httpx's multipart, so the field names are the client's): every
field arrives; a wrong one is refused with OpenAI's error object naming it; an upload past the
bound is refused from its Content-Length before a byte is read, or, sent without one, after
the bound, not at its end."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

from runtime.serve.errors import ApiError
from runtime.serve.transcriptions import FIELD_BYTES, read_transcription_form

openai = pytest.importorskip("openai")
httpx = pytest.importorskip("httpx2")
pytest.importorskip("python_multipart")  # python-multipart, which Starlette's form parser needs
from starlette.applications import Starlette  # noqa: E402
from starlette.requests import Request  # noqa: E402
from starlette.responses import JSONResponse  # noqa: E402
from starlette.routing import Route  # noqa: E402

MAX_BYTES = 4096
AUDIO = bytes(range(256)) * 10  # 2,560 bytes, every byte value (a binary part kept whole)


async def transcriptions(request: Request) -> JSONResponse:
    """Answers with the form it read (the audio as its length and bytes as a list)."""
    try:
        form = await read_transcription_form(request, MAX_BYTES)
    except ApiError as refused:
        return JSONResponse(refused.body(), refused.status)
    fields = {**form.__dict__, "audio": list(form.audio)}
    return JSONResponse({"text": json.dumps(fields)})


APP = Starlette(routes=[Route("/v1/audio/transcriptions", transcriptions, methods=["POST"])])


def client() -> Any:
    transport = httpx.ASGITransport(app=APP)
    return openai.AsyncOpenAI(base_url="http://test/v1", api_key="key", max_retries=0,
                              http_client=httpx.AsyncClient(transport=transport))


def create(**options: Any) -> dict[str, Any]:
    """The form the app read from the client's request."""
    async def call() -> Any:
        return await client().audio.transcriptions.create(**options)
    return json.loads(asyncio.run(call()).text)


def refusal(**options: Any) -> tuple[int, dict[str, Any]]:
    async def call() -> Any:
        return await client().audio.transcriptions.create(**options)
    with pytest.raises(openai.APIStatusError) as refused:
        asyncio.run(call())
    return refused.value.status_code, refused.value.body


def test_the_clients_fields_arrive() -> None:
    form = create(model="whisper-tiny", file=("talk.flac", AUDIO), language="fr",
                  prompt="Bonjour.", temperature=0.4, response_format="verbose_json",
                  timestamp_granularities=["segment"])
    assert bytes(form.pop("audio")) == AUDIO
    assert form == {"filename": "talk.flac", "model": "whisper-tiny",
                    "response_format": "verbose_json", "language": "fr", "prompt": "Bonjour.",
                    "temperature": 0.4, "timestamp_granularities": ["segment"]}
    defaults = create(model="m", file=("a.wav", b"RIFF"))
    assert (defaults["response_format"], defaults["language"], defaults["prompt"],
            defaults["temperature"], defaults["timestamp_granularities"]) == (
        "json", None, None, 0.0, ["segment"])


@pytest.mark.parametrize(("options", "status", "param"), [
    ({"temperature": 1.5}, 400, "temperature"),
    ({"extra_body": {"temperature": "hot"}}, 400, "temperature"),
    ({"response_format": "xml"}, 400, "response_format"),
    ({"language": "english"}, 400, "language"),
    ({"language": "zz"}, 400, "language"),
    ({"response_format": "verbose_json", "timestamp_granularities": ["word"]}, 400,
     "timestamp_granularities"),
    ({"timestamp_granularities": ["segment"]}, 400, "timestamp_granularities"),  # json
    ({"extra_body": {"diarize": "true"}}, 400, "diarize"),
    ({"file": ("big.wav", bytes(MAX_BYTES + 1))}, 413, "file"),
    ({"model": ""}, 400, "model"),
])
def test_a_wrong_field_is_refused_by_name(options: dict[str, Any], status: int,
                                          param: str) -> None:
    code, body = refusal(**{"model": "m", "file": ("a.wav", AUDIO), **options})
    assert (code, body["param"], body["type"]) == (status, param, "invalid_request_error")
    assert body["message"].startswith(param) or "argument" in body["message"], body


def post(**request: Any) -> tuple[int, dict[str, Any]]:
    """A request the client would not send, by httpx itself."""
    async def call() -> Any:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=APP)) as raw:
            return await raw.post("http://test/v1/audio/transcriptions", **request)
    response = asyncio.run(call())
    return response.status_code, response.json()["error"]


BOUNDARY = "b0undary"


def multipart(*parts: tuple[str, str | None, bytes]) -> dict[str, Any]:
    """A multipart/form-data request of (name, file name or None for text, content) parts."""
    body = b""
    for name, filename, content in parts:
        disposition = f'form-data; name="{name}"' + (
            f'; filename="{filename}"' if filename is not None else "")
        body += f"--{BOUNDARY}\r\nContent-Disposition: {disposition}\r\n\r\n".encode()
        body += content + b"\r\n"
    return {"content": body + f"--{BOUNDARY}--\r\n".encode(),
            "headers": {"content-type": f"multipart/form-data; boundary={BOUNDARY}"}}


@pytest.mark.parametrize(("request_", "param", "code"), [
    ({"json": {"model": "m", "file": "a.wav"}}, None, "invalid_content_type"),
    ({"data": {"model": "m", "file": "a.wav"}}, None, "invalid_content_type"),  # url-encoded
    (multipart(("model", None, b"m")), "file", "missing_required"),
    (multipart(("model", None, b"m"), ("file", None, b"text")), "file", "invalid_type"),
    (multipart(("model", "m.txt", b"m")), "model", "invalid_type"),
    (multipart(("model", None, b"m"), ("file", "a.wav", AUDIO), ("file", "b.wav", AUDIO)), None,
     "invalid_multipart"),  # two files
    (multipart(("model", None, b"m"), ("file", "a.wav", AUDIO), ("other", None, b"1")),
     "other", "unknown_parameter"),
    (multipart(("model", None, b"m"), ("file", "a.wav", AUDIO), ("stream", None, b"true")),
     "stream", "unsupported_value"),
    ({"content": b"--x\r\nbroken", "headers": {"content-type": "multipart/form-data"}}, None,
     "invalid_multipart"),  # no boundary
])
def test_a_body_that_is_not_the_form_is_refused(request_: dict[str, Any], param: str | None,
                                                code: str) -> None:
    status, error = post(**request_)
    assert (status, error["param"], error["code"]) == (400, param, code)


def upload(declared: int | None, chunks: int, chunk: bytes) -> tuple[int, dict[str, Any], int]:
    """read_transcription_form on a request whose body arrives in `chunks` pieces (a
    multipart preamble, then a file part that never ends); returns the refusal and the
    number of pieces the reader took."""
    head = (f"--{BOUNDARY}\r\nContent-Disposition: form-data; name=\"file\"; "
            "filename=\"a.wav\"\r\nContent-Type: audio/wav\r\n\r\n").encode()
    taken = 0

    async def receive() -> dict[str, Any]:
        nonlocal taken
        taken += 1
        return {"type": "http.request", "body": head if taken == 1 else chunk,
                "more_body": taken < chunks}

    headers = [(b"content-type", f"multipart/form-data; boundary={BOUNDARY}".encode())]
    if declared is not None:
        headers.append((b"content-length", str(declared).encode()))
    request = Request({"type": "http", "method": "POST", "path": "/", "headers": headers},
                      receive)
    with pytest.raises(ApiError) as refused:
        asyncio.run(read_transcription_form(request, MAX_BYTES))
    return refused.value.status, refused.value.body()["error"], taken


def test_an_upload_past_the_bound_is_refused_without_reading_it_all() -> None:
    status, error, taken = upload(declared=10**9, chunks=10**6, chunk=bytes(65536))
    assert (status, error["param"], error["code"], taken) == (413, "file", "file_too_large", 0)
    # without a Content-Length (2 MB sent), refused once the bound is passed
    status, error, taken = upload(declared=None, chunks=2000, chunk=bytes(1024))
    assert (status, error["param"]) == (413, "file")
    assert taken <= (MAX_BYTES + FIELD_BYTES) // 1024 + 2
