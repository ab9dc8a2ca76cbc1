"""`render_chat`: a chat template rendered in a worker process whose address space is limited.

The sandbox (runtime/files/chat.py) checks a render's time and size between operations, but
one operation can allocate gigabytes before the next check (`'%1000000000d' % 1`,
`s.replace('a', s)`), and a server renders the templates of the exports it serves for every
chat request. So a render runs in a worker process under RLIMIT_AS = RENDER_MEMORY: past it
the operation raises MemoryError inside the worker, which answers with a refusal and goes on.
A render that overruns its time inside one C call (no check reached) has its worker killed at
`seconds` + GRACE. Workers are started on first use (python and jinja2: some 100 ms) and
reused, at most MAX_WORKERS at once; each render costs a round trip over two pipes.
Where the kernel does not enforce RLIMIT_AS (macOS, Windows), a render runs in this process as
before, under the time and size bounds only.

Run as `python -m runtime.files.chat_worker`, this module is the worker: length-prefixed JSON
requests on stdin, replies on stdout (the real stdout: anything else printed goes to stderr).
"""

from __future__ import annotations

import json
import os
import select
import struct
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, BinaryIO

from registry.errors import ZooError
from registry.paths import display_path
from runtime.files.chat import (
    RENDER_CHARS,
    RENDER_SECONDS,
    RenderRefused,
    render_source,
    size_checked,
)

RENDER_MEMORY = 768 << 20  # bytes of address space: the interpreter, jinja2 and a large prompt
GRACE = 5.0  # seconds past a render's budget before its worker is killed (the first start)
MAX_WORKERS = 2  # renders at once; more wait for a worker
_HEADER = struct.Struct(">Q")
_PACKAGE_ROOT = Path(__file__).resolve().parents[2]  # the folder that holds runtime/


def limited() -> bool:
    """Can a worker's address space be limited here? Linux's kernel enforces RLIMIT_AS; macOS
    accepts some values and enforces none, Windows has no `resource`."""
    try:
        import resource
    except ImportError:
        return False
    return sys.platform.startswith("linux") and hasattr(resource, "RLIMIT_AS")


def render_chat(path: Path, messages: list[dict[str, Any]], bos: str = "", eos: str = "",
                seconds: float = RENDER_SECONDS, chars: int = RENDER_CHARS,
                tools: list[dict[str, Any]] | None = None, generation_prompt: bool = True
                ) -> str:
    """The prompt text for `messages` ({role, content} each), ending where the assistant's
    reply begins (add_generation_prompt, as transformers' apply_chat_template; without it,
    the conversation as written, which `--task chat` trains on); refused in one line past
    `seconds` or `chars`, past the memory a render may use, or on any error the template
    raises."""
    source = size_checked(path)
    try:
        return render_isolated(source.read_text(encoding="utf-8"), messages, bos, eos, seconds,
                               chars, tools, generation_prompt)
    except RenderRefused as exc:
        raise ZooError(f"{display_path(path)}: {exc}") from None
    except UnicodeDecodeError as exc:
        raise ZooError(f"{display_path(path)}: the chat template is not UTF-8 ({exc.reason} "
                       f"at byte {exc.start})") from None


def render_isolated(source: str, messages: list[dict[str, Any]], bos: str, eos: str,
                    seconds: float, chars: int, tools: list[dict[str, Any]] | None = None,
                    generation_prompt: bool = True) -> str:
    """`render_source` in a worker process (RenderRefused as there)."""
    if not limited():
        return render_source(source, messages, bos, eos, seconds, chars, tools,
                             generation_prompt)
    request = {"source": source, "messages": messages, "bos": bos, "eos": eos,
               "seconds": seconds, "chars": chars, "tools": tools,
               "generation_prompt": generation_prompt}
    with _POOL.slots:
        worker = _POOL.take()
        try:
            reply = worker.ask(request, time.monotonic() + seconds + GRACE)
        except TimeoutError:
            worker.close()
            raise RenderRefused(f"refused the chat template: it ran past the {seconds:g} s a "
                                "render may take") from None
        except (OSError, EOFError, ValueError):
            worker.close()  # died: its memory or a signal; the next render starts another
            raise RenderRefused("refused the chat template: its render's process ended "
                                "(past the memory a render may use)") from None
        _POOL.give(worker)
    if "error" in reply:
        raise RenderRefused(reply["error"])
    return reply["text"]


class _Worker:
    def __init__(self) -> None:
        path = os.environ.get("PYTHONPATH")
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(
            [str(_PACKAGE_ROOT), *([path] if path else [])])}
        self.process = subprocess.Popen(
            [sys.executable, "-m", "runtime.files.chat_worker"], stdin=subprocess.PIPE,
            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=env, close_fds=True)

    def ask(self, request: dict[str, Any], deadline: float) -> dict[str, Any]:
        assert self.process.stdin is not None and self.process.stdout is not None
        write_frame(self.process.stdin, request)
        header = self._read(self.process.stdout.fileno(), _HEADER.size, deadline)
        (size,) = _HEADER.unpack(header)
        return json.loads(self._read(self.process.stdout.fileno(), size, deadline))

    @staticmethod
    def _read(fd: int, size: int, deadline: float) -> bytes:
        data = bytearray()
        while len(data) < size:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([fd], [], [], left)[0]:
                raise TimeoutError
            piece = os.read(fd, size - len(data))
            if not piece:
                raise EOFError
            data += piece
        return bytes(data)

    def close(self) -> None:
        self.process.kill()
        self.process.wait()
        for pipe in (self.process.stdin, self.process.stdout):
            if pipe is not None:
                pipe.close()


class _Pool:
    def __init__(self) -> None:
        self.slots = threading.BoundedSemaphore(MAX_WORKERS)
        self.lock = threading.Lock()
        self.idle: list[_Worker] = []

    def take(self) -> _Worker:
        with self.lock:
            while self.idle:
                worker = self.idle.pop()
                if worker.process.poll() is None:
                    return worker
                worker.close()
        return _Worker()

    def give(self, worker: _Worker) -> None:
        with self.lock:
            self.idle.append(worker)


_POOL = _Pool()


def write_frame(stream: BinaryIO, message: dict[str, Any]) -> None:
    data = json.dumps(message).encode()
    stream.write(_HEADER.pack(len(data)) + data)
    stream.flush()


def read_frame(stream: BinaryIO) -> dict[str, Any] | None:
    header = stream.read(_HEADER.size)
    if len(header) < _HEADER.size:
        return None  # the server went: so does the worker
    return json.loads(stream.read(_HEADER.unpack(header)[0]))


def main() -> None:
    import resource

    resource.setrlimit(resource.RLIMIT_AS, (RENDER_MEMORY, RENDER_MEMORY))
    replies = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)  # a print inside jinja2 cannot corrupt a reply
    requests = sys.stdin.buffer
    while (request := read_frame(requests)) is not None:
        try:
            reply = {"text": render_source(**request)}
        except RenderRefused as exc:
            reply = {"error": str(exc)}
        except MemoryError:  # outside the render's own handler (reading the request)
            reply = {"error": "refused the chat template: it needed more memory than a "
                     "render may use"}
        write_frame(replies, reply)


if __name__ == "__main__":
    main()
