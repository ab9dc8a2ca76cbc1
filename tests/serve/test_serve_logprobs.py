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

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from tokenizers import AddedToken, Tokenizer, decoders, models

from export.targets.tokenizer_files import BYTE_SPECIALS, byte_level_json
from runtime.files.chat import CHAT_TEMPLATE
from runtime.files.tokenizer import ByteTokenizer, HuggingFaceTokenizer
from tests.conftest import on_shared
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


@pytest.mark.slow
@on_shared("transformer-tiny")
def test_an_encoder_decoder_refuses_logprobs(shared_export, tmp_path: Path) -> None:
    """Its generation runs whole in a worker, which scores nothing: a 400 naming the field,
    and the export goes on answering."""
    server = Server([shared_export("transformer-tiny")[0]], tmp_path / "serve.log",
                    "--name", "seq2seq")
    try:
        body = {"model": "seq2seq", "prompt": [5, 6, 7], "max_tokens": 3}
        assert error_of(server.request("/v1/completions", body | {"logprobs": 1})) == \
            (400, "logprobs", "unsupported_value")
        assert server.request("/v1/completions", body)[0] == 200
    finally:
        server.stop()


MC = [("The sky is", [" blue", " green", " loud"]), ("Cats say", [" meow", " woof"]),
      ("Two plus two is", [" four", " five", " six", " seven"]), ("Ice is", [" cold", " hot"]),
      ("The sun rises in the", [" east", " west"]), ("Fish live in", [" water", " sand"]),
      ("Snow is", [" white", " black"]), ("A week has", [" seven days", " five days"])]
GENERATE = ["Once upon", "abc", "héllo", "The"]
NEW_TOKENS = 8


def lm_eval_tasks(folder: Path, model: Any, tokenizer: Any) -> Path:
    """folder: a multiple-choice task (the first choice right) and a generate_until task whose
    targets are transformers' greedy answer for every other prompt (so half are right, for a
    model that answers as transformers does), each from a JSONL file, as lm-eval's YAML."""
    folder.mkdir()
    rows = {"mc": [{"question": q, "choices": c, "answer": 0} for q, c in MC], "gen": []}
    for index, prompt in enumerate(GENERATE):
        ids = tokenizer(prompt, return_tensors="pt").input_ids
        out = model.generate(ids, max_new_tokens=NEW_TOKENS, do_sample=False,
                             pad_token_id=BYTES.pad, eos_token_id=BYTES.eos)
        answer = tokenizer.decode(out[0, ids.shape[1]:], skip_special_tokens=True)
        rows["gen"].append({"prompt": prompt, "target": answer.split("\n")[0] if index % 2 == 0
                            else "not this"})
    for name, docs in rows.items():
        (folder / f"{name}.jsonl").write_text("".join(json.dumps(d) + "\n" for d in docs),
                                              encoding="utf-8")
    data = "dataset_path: json\ntest_split: test\ndataset_kwargs:\n  data_files:\n    test: {}\n"
    (folder / "zoo_mc.yaml").write_text(
        "task: zoo_mc\n" + data.format(folder / "mc.jsonl") + "output_type: multiple_choice\n"
        "doc_to_text: '{{question}}'\ndoc_to_choice: '{{choices}}'\ndoc_to_target: "
        "'{{answer}}'\nmetric_list:\n  - metric: acc\n", encoding="utf-8")
    (folder / "zoo_gen.yaml").write_text(
        "task: zoo_gen\n" + data.format(folder / "gen.jsonl") + "output_type: generate_until\n"
        "doc_to_text: '{{prompt}}'\ndoc_to_target: '{{target}}'\ngeneration_kwargs:\n"
        f"  until: ['\\n']\n  max_gen_toks: {NEW_TOKENS}\n  do_sample: false\n"
        "  temperature: 0\nmetric_list:\n  - metric: exact_match\n", encoding="utf-8")
    return folder


def lm_eval(model: str, args: str, tasks: Path, out: Path) -> tuple[dict, dict]:
    """`lm-eval run` in a subprocess, offline: (results by task, responses by task)."""
    env = {**os.environ, "HF_DATASETS_OFFLINE": "1", "HF_HUB_OFFLINE": "1",
           "HF_HOME": str(out / "hf-home"), "OMP_NUM_THREADS": "1"}
    done = subprocess.run([sys.executable, "-m", "lm_eval", "run", "--model", model,
                           "--model_args", args, "--tasks", "zoo_mc,zoo_gen",
                           "--include_path", str(tasks), "--output_path", str(out),
                           "--log_samples", "--device", "cpu"],
                          env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    results = json.loads(next(out.rglob("results_*.json")).read_text())["results"]
    responses = {task: [json.loads(line)["filtered_resps"] for line in
                        next(out.rglob(f"samples_{task}_*.jsonl")).read_text().splitlines()]
                 for task in ("zoo_mc", "zoo_gen")}
    return results, responses


@pytest.mark.slow
def test_lm_eval_scores_zoo_serve_as_it_scores_transformers(tmp_path: Path) -> None:
    """lm-evaluation-harness's `local-completions` model against `zoo serve` (loglikelihoods
    from echo + logprobs, answers from max_tokens and stop) and its `hf` model on the same
    Hugging Face folder: the same accuracies, each choice's loglikelihood within 1e-4, the same
    generated answers."""
    pytest.importorskip("lm_eval")
    folder = llama_folder(tmp_path / "hf", max_positions=256)
    model = transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    tasks = lm_eval_tasks(tmp_path / "tasks", model,
                          transformers.AutoTokenizer.from_pretrained(folder))
    zoo_ok("import", folder, "-o", tmp_path / "built")
    zoo_ok("export", tmp_path / "built", "--onnx", "-o", tmp_path / "llama")
    server = Server([tmp_path / "llama"], tmp_path / "serve.log")
    try:
        served = lm_eval("local-completions", f"base_url={server.base}/v1/completions,"
                         f"model=llama,tokenizer={folder},tokenizer_backend=huggingface,"
                         "tokenized_requests=True", tasks, tmp_path / "served")
    finally:
        server.stop()
    hf = lm_eval("hf", f"pretrained={folder},dtype=float32", tasks, tmp_path / "hf")
    for metric, task in (("acc,none", "zoo_mc"), ("exact_match,none", "zoo_gen")):
        assert served[0][task][metric] == hf[0][task][metric], (task, served[0], hf[0])
    assert hf[0]["zoo_gen"]["exact_match,none"] == 0.5  # the targets made to be half right
    np.testing.assert_allclose([float(choice[0]) for doc in served[1]["zoo_mc"] for choice in doc],
                               [float(choice[0]) for doc in hf[1]["zoo_mc"] for choice in doc],
                               rtol=0, atol=1e-4)
    assert served[1]["zoo_gen"] == hf[1]["zoo_gen"]
    assert "Traceback" not in (tmp_path / "serve.log").read_text()


def test_a_tokens_bytes_are_exact_for_each_kind_of_tokenizer_json(tmp_path: Path) -> None:
    """Byte-level BPE (GPT-2's stand-in letters), a SentencePiece-style BPE with byte fallback
    (Llama 2's `<0xE2>` pieces, `▁` for a space) and an added token: each token's bytes."""
    path = tmp_path / "tokenizer.json"
    path.write_text(byte_level_json(BYTES), encoding="utf-8")
    byte_level = HuggingFaceTokenizer(path)
    assert [byte_level.token_bytes(i) for i in range(256)] == [bytes([i]) for i in range(256)]
    assert byte_level.token_bytes(BYTES.eos) == BYTE_SPECIALS["eos"].encode()
    pieces = Tokenizer(models.BPE(vocab={"<unk>": 0, "<0xE2>": 1, "<0x82>": 2, "<0xAC>": 3,
                                         "\u2581hi": 4, "h": 5, "i": 6, "\u2581": 7},
                                  merges=[], unk_token="<unk>", byte_fallback=True))
    pieces.decoder = decoders.Sequence([decoders.Replace("\u2581", " "), decoders.ByteFallback(),
                                        decoders.Fuse()])
    pieces.add_special_tokens([AddedToken("</s>", special=True)])
    pieces.save(str(path))
    fallback = HuggingFaceTokenizer(path)
    assert [fallback.token_bytes(i) for i in (1, 2, 3, 4, 8)] == \
        [b"\xe2", b"\x82", b"\xac", b" hi", b"</s>"]
    assert b"".join(fallback.token_bytes(i) for i in (4, 1, 2, 3)).decode() == " hi€"
