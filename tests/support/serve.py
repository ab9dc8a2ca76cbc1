"""A `zoo serve` in a subprocess over a tiny export, and what the serve tests share with it."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import numpy as np
from tokenizers import Tokenizer, models, pre_tokenizers

from runtime.files.chat import CHAT_TEMPLATE
from runtime.generate import generate
from runtime.sampling import Sampling
from tests.support.helpers import zoo

ROOT = Path(__file__).resolve().parents[2]
KEY = "sk-test-7731"
SPECIALS = ["<pad>", "<s>", "</s>", "<mask>"]  # gpt-tiny's and bert-tiny's ids 256..259
# a word a token: "w5 w6" is [5, 6]; the template's markers are words too, so a message of n
# words is n + 2 prompt tokens
TEMPLATE = ("{% for m in messages %}w1 {{ m['content'] }} {% endfor %}"
            "{% if add_generation_prompt %}w2{% endif %}")


def with_tokenizer(source: Path, folder: Path) -> Path:
    """A copy of an export with a word-level tokenizer.json over its 260 ids (the four
    specials dropped when decoding, as a real tokenizer's are) and a chat template."""
    shutil.copytree(source, folder)
    vocab = {f"w{i}": i for i in range(256)} | {name: 256 + i for i, name in enumerate(SPECIALS)}
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token="w0"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer.add_special_tokens(SPECIALS)
    tokenizer.save(str(folder / "tokenizer.json"))
    (folder / CHAT_TEMPLATE).write_text(TEMPLATE, encoding="utf-8")
    return folder


def with_byte_level_tokenizer(source: Path, folder: Path, template: str = TEMPLATE) -> Path:
    """A copy of a byte-level export (ids 0..255 are bytes) with the same ids as a byte-level
    BPE tokenizer.json (no merges: one token a byte, GPT-2's stand-in letters), the specials
    at 256..259, and the chat template: what a grammar engine and a chat client read."""
    from tokenizers import decoders

    shutil.copytree(source, folder)
    letters = pre_tokenizers.ByteLevel.alphabet()
    ordered = sorted(letters, key=_byte_of)
    vocab = {letter: _byte_of(letter) for letter in ordered}
    vocab |= {name: 256 + i for i, name in enumerate(SPECIALS)}
    tokenizer = Tokenizer(models.BPE(vocab, [], fuse_unk=False))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False,
                                                        use_regex=False)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.add_special_tokens(SPECIALS)
    tokenizer.save(str(folder / "tokenizer.json"))
    (folder / CHAT_TEMPLATE).write_text(template, encoding="utf-8")
    (folder / "byte-tokenizer.json").unlink(missing_ok=True)  # it would win over the json
    return folder


def _byte_of(letter: str) -> int:
    """GPT-2's byte-to-letter table inverted: printable bytes are themselves, the others
    shifted past 255 in order."""
    code = ord(letter)
    printable = [*range(33, 127), *range(161, 173), *range(174, 256)]
    if code in printable:
        return code
    others = [b for b in range(256) if b not in printable]
    return others[code - 256]


class Server:
    """`zoo serve` in a subprocess; its log (stderr) in a file."""

    def __init__(self, folders: list[Path], log: Path, *args: str) -> None:
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            self.port = probe.getsockname()[1]
        self.log = log
        command = [sys.executable, "-c", "import cli; cli.main()", "serve", *map(str, folders),
                   "--port", str(self.port), "--threads", "1", *args]
        env = {**os.environ, "OMP_NUM_THREADS": "1"}
        with log.open("wb") as out:
            self.process = subprocess.Popen(command, cwd=ROOT, env=env, stdout=out, stderr=out)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            assert self.process.poll() is None, log.read_text()
            try:
                if self.get("/health")[0] == 200:
                    return
            except OSError:
                time.sleep(0.1)
        raise AssertionError(f"the server did not start: {log.read_text()}")

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def request(self, path: str, body: bytes | dict | None = None, key: str | None = KEY,
                method: str | None = None) -> tuple[int, dict[str, Any]]:
        data = json.dumps(body).encode() if isinstance(body, dict) else body
        headers = {"Content-Type": "application/json"}
        if key is not None:
            headers["Authorization"] = f"Bearer {key}"
        request = urllib.request.Request(self.base + path, data, headers, method=method)
        try:
            with urllib.request.urlopen(request, timeout=30) as response:
                return response.status, json.loads(response.read())
        except urllib.error.HTTPError as error:
            return error.code, json.loads(error.read())

    def get(self, path: str) -> tuple[int, dict[str, Any]]:
        return self.request(path, key=KEY)

    def stop(self) -> int:
        self.process.send_signal(signal.SIGTERM)
        return self.process.wait(timeout=30)


class HeldAtThirdToken:
    """The plain graph of a runtime, each run taking 20 ms more (100 tokens take 2 s), that
    waits, once its row has 3 tokens, until the client's leaving has cancelled it: the
    scheduler's thread cannot run on while the event loop is slow to see the hang-up."""

    def __init__(self, runtime: Any) -> None:
        self.runtime, self.card, self.spec = runtime, runtime.card, runtime.spec
        self.scheduler: Any = None

    def run(self, file: str, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        time.sleep(0.02)
        deadline = time.monotonic() + 30
        rows = self.scheduler.rows if self.scheduler else []
        while (any(len(job.tokens) >= 3 and not job.cancelled for job in rows)
               and time.monotonic() < deadline):
            time.sleep(0.005)
        return self.runtime.run(file, feeds)


def zoo_run(*args: str | Path) -> str:
    result = zoo("run", *args)
    assert result.exit_code == 0, result.output
    return result.stdout.rstrip("\n")


SAMPLE = re.compile(r"^([a-z_]+)(?:\{(.*)\})? (\S+)$")
LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')


def scrape(server: Server) -> dict[tuple, float]:
    """GET /metrics (with the key: it is behind it) parsed: {(name, sorted labels): value}."""
    request = urllib.request.Request(server.base + "/metrics",
                                     headers={"Authorization": f"Bearer {KEY}"})
    with urllib.request.urlopen(request, timeout=30) as response:
        assert response.headers["Content-Type"].startswith("text/plain; version=0.0.4")
        text = response.read().decode()
    samples = {}
    for line in text.splitlines():
        if line.startswith("#"):
            assert re.match(r"# (HELP|TYPE) zoo_\w+ ", line), line
            continue
        name, labels, value = SAMPLE.match(line).groups()  # type: ignore[union-attr]
        samples[name, tuple(sorted(LABEL.findall(labels or "")))] = float(value)
    return samples


class Collected:
    """A job's events, gathered from the scheduler's thread."""

    def __init__(self) -> None:
        self.events: list[tuple[str, Any]] = []
        self.finished = threading.Event()

    def __call__(self, event: tuple[str, Any]) -> None:
        self.events.append(event)
        if event[0] in ("done", "gone", "error"):
            self.finished.set()


def alone(runtime: Any, prompt: list[int], tokens: int, sampling: Sampling) -> list[int]:
    """`zoo run`'s tokens for the prompt by itself, up to and with eos."""
    eos = runtime.card["eos_token_id"]
    row = generate(runtime, np.array([prompt]), None, tokens, sampling, eos)[0].tolist()
    return row[:row.index(eos) + 1] if eos in row else row
