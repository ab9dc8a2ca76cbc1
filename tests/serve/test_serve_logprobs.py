"""`zoo serve`'s log-probabilities (issue 45): a tiny random transformers Llama over a
byte-level tokenizer.json (tests/support/decoder_folders.py), `zoo import`ed and exported, served
with `--prefill-chunk 8` (an echoed prompt is scored in chunks of it) and asked through the
real `openai` client. Every value is transformers' own `torch.log_softmax` of the model's logits
at temperature 1 (whatever the request's temperature), generated and echoed tokens alike, and
the alternatives are its largest, in order; streams carry the same values as whole answers;
bad values are a 400 naming the field. The byte tokenizer splits a non-ASCII character into
tokens of one byte each: a token's `bytes` are checked exactly.

lm-evaluation-harness against the server (slow): `local-completions` and `hf` on the same
folder reach the same accuracy on a multiple-choice (loglikelihood) and a `generate_until` task."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from export.targets.tokenizer_files import BYTE_SPECIALS
from runtime.files.chat import CHAT_TEMPLATE
from runtime.files.tokenizer import ByteTokenizer
from tests.support.decoder_folders import llama_folder
from tests.support.helpers import zoo_ok
from tests.support.serve import KEY, Server

openai = pytest.importorskip("openai")
transformers = pytest.importorskip("transformers")

# a message between angle brackets: the chat of "héllo" is the bytes of "<héllo>"
TEMPLATE = "{% for m in messages %}<{{ m['content'] }}>{% endfor %}"
PROMPT = "héllo wörld, ça va"  # 21 bytes: past the prefill chunk of 8, pieces of characters
CHUNK = 8
BYTES = ByteTokenizer()
ID_OF = {bytes([byte]): byte for byte in range(256)} | {
    name.encode(): getattr(BYTES, role) for role, name in BYTE_SPECIALS.items()}


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return llama_folder(tmp_path_factory.mktemp("hf"), max_positions=64)


@pytest.fixture(scope="module")
def model(folder: Path) -> Any:
    return transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()


@pytest.fixture(scope="module")
def server(folder: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    root = tmp_path_factory.mktemp("llama")
    zoo_ok("import", folder, "-o", root / "built")
    (root / "built" / CHAT_TEMPLATE).write_text(TEMPLATE, encoding="utf-8")
    zoo_ok("export", root / "built", "--onnx", "-o", root / "llama")
    served = Server([root / "llama"], root / "serve.log", "--api-key", KEY,
                    "--prefill-chunk", str(CHUNK))
    yield served
    served.stop()


@pytest.fixture(scope="module")
def client(server: Server) -> Any:
    return openai.OpenAI(base_url=server.base + "/v1", api_key=KEY, max_retries=0)


def reference(model: Any, ids: list[int]) -> np.ndarray:
    """transformers' log-probabilities (positions, vocab) of the next token after each."""
    with torch.no_grad():
        logits = model(torch.tensor([ids])).logits[0]
    return torch.log_softmax(logits.double(), dim=-1).numpy()


def legacy_id(token: str) -> int:
    """A legacy `tokens` string back to its id: a byte, `bytes:\\xNN`, a special token."""
    if token.startswith("bytes:"):
        return int(token.removeprefix("bytes:\\x"), 16)
    return ID_OF[token.encode()]


def check_chat_entries(content: list[Any], prompt: list[int], model: Any, top: int) -> None:
    """Each entry is transformers' value for its token after the prompt and the tokens before
    it; its alternatives are the `top` largest, in order; its string is its bytes as text."""
    tokens = [ID_OF[bytes(entry.bytes)] for entry in content]
    expected = reference(model, prompt + tokens)
    for index, entry in enumerate(content):
        row = expected[len(prompt) + index - 1]
        assert entry.logprob == pytest.approx(row[tokens[index]], abs=1e-4)
        assert entry.token == bytes(entry.bytes).decode("utf-8", errors="backslashreplace")
        assert [ID_OF[bytes(t.bytes)] for t in entry.top_logprobs] == \
            np.argsort(-row, kind="stable")[:top].tolist()
        np.testing.assert_allclose([t.logprob for t in entry.top_logprobs],
                                   np.sort(row)[::-1][:top], rtol=0, atol=1e-4)


CHAT = dict(model="llama", messages=[{"role": "user", "content": "héllo"}], max_tokens=8,
            temperature=1.5, top_p=0.9, seed=5, logprobs=True, top_logprobs=3)


def test_chat_logprobs_are_transformers_at_temperature_one(client: Any, model: Any) -> None:
    """Sampled at temperature 1.5, top_p 0.9: the values are still the model's own."""
    reply = client.chat.completions.create(**CHAT)
    content = reply.choices[0].logprobs.content
    assert len(content) == reply.usage.completion_tokens >= 2
    check_chat_entries(content, list(b"<h\xc3\xa9llo>"), model, top=3)
    text = b"".join(bytes(e.bytes) for e in content if ID_OF[bytes(e.bytes)] < 256)
    assert text.decode("utf-8", errors="replace") == reply.choices[0].message.content


def test_a_streamed_chat_carries_the_same_logprobs_with_its_text(client: Any) -> None:
    whole = client.chat.completions.create(**CHAT).choices[0].logprobs.content
    chunks = [c for c in client.chat.completions.create(**CHAT, stream=True) if c.choices]
    streamed = [entry for c in chunks if c.choices[0].logprobs
                for entry in c.choices[0].logprobs.content]
    assert [e.model_dump() for e in streamed] == [e.model_dump() for e in whole]
    # a chunk with text carries the tokens picked since the chunk before it, at least one
    texts = [c for c in chunks if c.choices[0].delta.content]
    assert len(texts) > 1 and all(c.choices[0].logprobs.content for c in texts)


def test_chat_without_logprobs_has_none(client: Any) -> None:
    reply = client.chat.completions.create(**{**CHAT, "logprobs": False, "top_logprobs": None})
    assert reply.choices[0].logprobs is None
    zero = client.chat.completions.create(**{**CHAT, "top_logprobs": 0})
    assert all(entry.top_logprobs == [] for entry in zero.choices[0].logprobs.content)


def check_legacy(logprobs: Any, ids: list[int], model: Any, top: int, echoed: int) -> None:
    """The legacy shape over `ids` (the first `echoed` of them the prompt, its first without a
    value): transformers' values; per token the `top` largest in order, then the token itself
    where it is not among them."""
    assert [legacy_id(token) for token in logprobs.tokens] == ids
    expected = reference(model, ids)
    for index, (value, tops) in enumerate(zip(logprobs.token_logprobs, logprobs.top_logprobs,
                                              strict=True)):
        if index == 0 and echoed:
            assert value is None and tops is None
            continue
        row = expected[index - 1]
        assert value == pytest.approx(row[ids[index]], abs=1e-4)
        best = np.argsort(-row, kind="stable")[:top].tolist()
        listed = [legacy_id(token) for token in tops]
        assert listed == best + ([] if ids[index] in best else [ids[index]])
        np.testing.assert_allclose(list(tops.values()), row[listed], rtol=0, atol=1e-4)
        if index >= echoed:  # temperature 0: the generated token is the likeliest
            assert ids[index] == best[0]


def char_offsets(text: str) -> list[int]:
    """For each UTF-8 byte of `text`, the index of the character it belongs to."""
    return [index for index, char in enumerate(text) for _ in char.encode()]


def test_an_echoed_completion_scores_its_prompt_and_answer(client: Any, model: Any) -> None:
    reply = client.completions.create(model="llama", prompt=PROMPT, max_tokens=5, temperature=0,
                                      logprobs=5, echo=True)
    choice, prompt = reply.choices[0], list(PROMPT.encode())
    assert choice.text.startswith(PROMPT) and reply.usage.prompt_tokens == len(prompt)
    ids = [legacy_id(token) for token in choice.logprobs.tokens]
    assert ids[:len(prompt)] == prompt and len(ids) == len(prompt) + 5
    check_legacy(choice.logprobs, ids, model, 5, len(prompt))
    assert choice.logprobs.text_offset[:len(prompt)] == char_offsets(PROMPT)
    assert choice.logprobs.text_offset[len(prompt)] == len(PROMPT)


def test_max_tokens_0_scores_the_prompt_alone(client: Any, model: Any) -> None:
    """As OpenAI: echo with max_tokens 0 generates nothing (how a text is scored), whole or
    streamed; logprobs 0 lists only the token itself."""
    reply = client.completions.create(model="llama", prompt=PROMPT, max_tokens=0, echo=True,
                                      logprobs=0)
    choice = reply.choices[0]
    assert choice.text == PROMPT and reply.usage.completion_tokens == 0
    check_legacy(choice.logprobs, list(PROMPT.encode()), model, 0, len(PROMPT.encode()))
    chunks = [c for c in client.completions.create(model="llama", prompt=PROMPT, max_tokens=0,
                                                   echo=True, logprobs=0, stream=True)
              if c.choices]
    assert "".join(c.choices[0].text for c in chunks) == PROMPT
    streamed = [c.choices[0].logprobs for c in chunks if c.choices[0].logprobs]
    assert len(streamed) == 1 and streamed[0].model_dump() == choice.logprobs.model_dump()


def test_a_streamed_completion_with_echo_and_logprobs(client: Any, model: Any) -> None:
    whole = client.completions.create(model="llama", prompt=[5, 80, 200, 9], max_tokens=6,
                                      temperature=0, logprobs=2, echo=True).choices[0]
    chunks = [c.choices[0] for c in client.completions.create(
        model="llama", prompt=[5, 80, 200, 9], max_tokens=6, temperature=0, logprobs=2,
        echo=True, stream=True) if c.choices]
    assert "".join(c.text for c in chunks) == whole.text
    joined: dict[str, list] = {key: [] for key in whole.logprobs.model_dump()}
    for chunk in chunks:
        for key, values in (chunk.logprobs.model_dump() if chunk.logprobs else {}).items():
            joined[key] += values
    assert joined == whole.logprobs.model_dump()
    check_legacy(whole.logprobs, [legacy_id(t) for t in whole.logprobs.tokens], model, 2, 4)


def test_completion_logprobs_without_echo_are_the_answers(client: Any, model: Any) -> None:
    choice = client.completions.create(model="llama", prompt="ab", max_tokens=4, temperature=0,
                                       logprobs=1).choices[0]
    generated = [legacy_id(token) for token in choice.logprobs.tokens]
    assert len(generated) == 4 and choice.logprobs.text_offset[0] == 0
    expected = reference(model, [97, 98, *generated])
    for index, value in enumerate(choice.logprobs.token_logprobs):
        assert value == pytest.approx(expected[index + 1, generated[index]], abs=1e-4)


def error_of(reply: tuple[int, dict[str, Any]]) -> tuple[int, str | None, str | None]:
    return reply[0], reply[1]["error"]["param"], reply[1]["error"]["code"]


MESSAGES = [{"role": "user", "content": "hi"}]


@pytest.mark.parametrize(("path", "body", "expected"), [
    ("/v1/chat/completions", {"logprobs": True, "top_logprobs": 21},
     (400, "top_logprobs", "invalid_value")),
    ("/v1/chat/completions", {"logprobs": True, "top_logprobs": -1},
     (400, "top_logprobs", "invalid_value")),
    ("/v1/chat/completions", {"top_logprobs": 2}, (400, "top_logprobs", "invalid_value")),
    ("/v1/chat/completions", {"logprobs": False, "top_logprobs": 2},
     (400, "top_logprobs", "invalid_value")),
    ("/v1/chat/completions", {"logprobs": "yes"}, (400, "logprobs", "invalid_type")),
    ("/v1/chat/completions", {"logprobs": True, "top_logprobs": 2.5},
     (400, "top_logprobs", "invalid_type")),
    ("/v1/chat/completions", {"echo": True}, (400, "echo", "unknown_parameter")),
    ("/v1/completions", {"logprobs": 6}, (400, "logprobs", "invalid_value")),
    ("/v1/completions", {"logprobs": -1}, (400, "logprobs", "invalid_value")),
    ("/v1/completions", {"logprobs": True}, (400, "logprobs", "invalid_type")),
    ("/v1/completions", {"echo": 1}, (400, "echo", "invalid_type")),
    ("/v1/completions", {"max_tokens": 0}, (400, "max_tokens", "invalid_value")),
    ("/v1/completions", {"max_tokens": -1, "echo": True}, (400, "max_tokens", "invalid_value")),
    ("/v1/completions", {"top_logprobs": 2}, (400, "top_logprobs", "unknown_parameter")),
])
def test_bad_values_are_400s_naming_the_field(server: Server, path: str, body: dict,
                                              expected: tuple) -> None:
    base = {"model": "llama", "max_tokens": 2} | (
        {"messages": MESSAGES} if "chat" in path else {"prompt": "ab"})
    assert error_of(server.request(path, base | body)) == expected


def test_the_server_logged_no_traceback(server: Server) -> None:
    assert "Traceback" not in server.log.read_text()
