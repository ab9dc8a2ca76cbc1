"""`zoo evaluate OUT`: a classifier on labelled rows (beside PyTorch's predictions), an
encoder-decoder's exact match on held-out inputs, a decoder's perplexity on a text, a chat
model's greedy replies to held-out conversations (exact match).

A decoder's perplexity runs on ONNX Runtime alone; the classifier's comparison with PyTorch
and the reversal task's held-out pairs load torch, so they import it where they need it."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from registry.errors import ZooError
from registry.options import option
from registry.paths import display_path
from runtime.classify import predictions
from runtime.exact_match import exact_match
from runtime.files.conversations import TRAINED_ROLE, read_conversations
from runtime.files.labelled import label_ids, read_rows
from runtime.files.texts import read_token_ids
from runtime.files.tokenizer import Tokenizer, load_tokenizer, sequence_ids
from runtime.opening import open_export
from runtime.perplexity import score_text
from runtime.scores import scores
from runtime.sessions import PROVIDERS

Progress = Callable[[str], None]
TASKS = ("reverse",)  # --task: the held-out inputs an encoder-decoder is scored on
CHAT_BATCH = 16  # --chat: conversations answered at once


@dataclass(frozen=True)
class EvaluateOptions:
    """What `zoo evaluate` scores: one of data (a classifier), task (an encoder-decoder) and
    text (a decoder)."""

    data: Path | None = option(None, "A classifier: labelled rows, JSONL or CSV of text, label "
                               "(as for zoo train --task classify).", path="file")
    task: str | None = option(None, "An encoder-decoder: reverse = held-out runs of the shipped "
                              "text's words.", choices=TASKS)
    text: Path | None = option(None, "A decoder: perplexity on this UTF-8 text (use text it did "
                               "not train on).", path="file")
    chat: Path | None = option(None, "A decoder with a chat template: JSONL conversations (as "
                               "for zoo train --task chat), each answered greedily up to its "
                               "last assistant turn and scored by exact match with it.",
                               path="file")
    window: int | None = option(None, "--text: tokens per window [max_positions].")
    count: int = option(200, "--task: held-out inputs.")
    beams: int = option(1, "--task: beam search width.")
    provider: str = option("cpu", "ONNX Runtime's execution provider.", choices=PROVIDERS)

    def check(self) -> None:
        if sum(given is not None for given in (self.data, self.task, self.text, self.chat)) != 1:
            raise ZooError("give one of --data FILE (a classifier), --task reverse (an "
                           "encoder-decoder), --text FILE (a decoder) or --chat FILE (a chat "
                           "model)")


def evaluate(folder: Path, options: EvaluateOptions, progress: Progress = lambda m: None
             ) -> list[str]:
    """`zoo evaluate`: the score options.check() allows, of the one kind asked for."""
    options.check()
    if options.data is not None:
        return evaluate_classifier(folder, options.data, options.provider)
    if options.text is not None:
        return evaluate_text(folder, options.text, options.window, options.provider, progress)
    if options.chat is not None:
        return evaluate_chat(folder, options.chat, options.provider, progress)
    return evaluate_task(folder, str(options.task), options.count, options.beams,
                         options.provider)


def _tokenizer(folder: Path, what: str) -> Tokenizer:
    tokenizer = load_tokenizer(folder)
    if tokenizer is None:
        raise ZooError(f"{display_path(folder)}: this export has no tokenizer to read {what} "
                       "with")
    return tokenizer


def evaluate_text(folder: Path, text_file: Path, window: int | None, provider: str = "cpu",
                  progress: Progress = lambda message: None) -> list[str]:
    runtime = open_export(folder, provider)
    spec = runtime.spec
    if not (spec.generates and spec.continues_prompt):
        raise ZooError(f"{folder}: a {runtime.card.family} export; --text scores a decoder's "
                       "next-token predictions")
    ids = read_token_ids(text_file, _tokenizer(folder, "the text"), 1)
    shown = [-1]

    def windows_done(done: int, total: int) -> None:  # about ten lines, whatever the length
        if 10 * done // total > shown[0]:
            shown[0] = 10 * done // total
            progress(f"perplexity: {done}/{total} windows")

    result = score_text(runtime, ids, window, windows_done)
    return [f"{text_file}: perplexity {result.perplexity:.3f} ({result.nats_per_token:.4f} "
            f"nats/token, {result.predictions} predictions; ONNX Runtime)"]


def evaluate_classifier(folder: Path, data: Path, provider: str = "cpu") -> list[str]:
    runtime = open_export(folder, provider)
    card = runtime.card
    if not card["num_labels"]:
        raise ZooError(f"{folder}: not a classifier export (num_labels is 0)")
    tokenizer = _tokenizer(folder, "the texts")
    rows = read_rows(data)
    truth = label_ids(rows, card["labels"], card["num_labels"])
    limit = card["max_positions"]
    prompts = [sequence_ids(tokenizer, example.text)[:limit] for example in rows.examples]
    onnx_says = predictions(runtime, prompts)
    from export.opening import open_model  # PyTorch, beside
    from zoo.files.weights import load_built

    torch_says = predictions(open_model(*load_built(folder)), prompts)
    names = card["labels"] or [str(i) for i in range(card["num_labels"])]
    result = scores(truth, onnx_says, names)
    same = sum(a == b for a, b in zip(onnx_says, torch_says, strict=True))
    return [f"{len(truth)} rows: accuracy {result['accuracy']:.3f}, macro-F1 "
            f"{result['macro_f1']:.3f} (ONNX Runtime); the same prediction as PyTorch on "
            f"{same} of {len(truth)}"]


def evaluate_task(folder: Path, task: str, count: int, beams: int, provider: str = "cpu"
                  ) -> list[str]:
    if count < 1:
        raise ZooError(f"--count {count}: should be >= 1")
    runtime = open_export(folder, provider)
    spec = runtime.spec
    if not spec.generates or spec.continues_prompt:  # it needs source -> new target
        raise ZooError(f"{folder}: a {runtime.card.family} export; --task {task} evaluates "
                       "an encoder-decoder")
    from zoo.training import reverse  # the task's vocabulary (torch)

    try:
        pairs = reverse.held_out(runtime.card["vocab_size"], count)
    except ValueError as exc:
        raise ZooError(f"--count {count}: {exc}") from exc
    result = exact_match(runtime, pairs, beams)
    show = _shown(folder)
    lines = [f"{show(source)!r} -> {show(output)!r} ({'ok' if output == target else 'wrong'})"
             for source, target, output in result.examples]
    return lines + [f"exact match: {result.correct}/{result.total} = {result.accuracy:.1%} "
                    "(held-out inputs)"]


def evaluate_chat(folder: Path, data: Path, provider: str = "cpu",
                  progress: Progress = lambda message: None) -> list[str]:
    """Exact match of the greedy reply to each conversation (its messages before its last
    assistant turn, in the export's chat template) with that turn's content; a reply counts
    only when it ends with the end token (whitespace at either end ignored)."""
    from runtime.exported import GenerateOptions, load

    exported = load(folder, provider)
    conversations = read_conversations(data)
    prompts, targets = [], []
    for row in conversations.rows:
        last = max(i for i, m in enumerate(row.messages) if m["role"] == TRAINED_ROLE)
        prompts.append(exported.chat_prompt(row.messages[:last]))
        targets.append(row.messages[last]["content"].strip())
    assert exported.tokenizer is not None  # chat_prompt refused it otherwise
    longest = max(len(exported.tokenizer.encode(target)) for target in targets)
    options = GenerateOptions(max_new_tokens=longest + 1)  # room for the end token
    eos, replies = exported.card["eos_token_id"], []
    for start in range(0, len(prompts), CHAT_BATCH):
        replies += exported.generate(prompts[start:start + CHAT_BATCH], options)
        progress(f"replies: {len(replies)}/{len(prompts)}")
    right = [eos in reply.ids and (reply.text or "").strip() == target
             for reply, target in zip(replies, targets, strict=True)]
    lines = [f"{conversations.where}:{row.line}: {(reply.text or '').strip()!r} "
             f"({'ok' if ok else 'wrong; expected ' + repr(target)})"
             for row, reply, target, ok in list(zip(conversations.rows, replies, targets, right,
                                                    strict=True))[:3]]
    return lines + [f"exact match: {sum(right)}/{len(right)} = {sum(right) / len(right):.1%} "
                    "(greedy replies, ONNX Runtime)"]


def _shown(folder: Path) -> Callable[[list[int]], str]:
    tokenizer = load_tokenizer(folder)
    return tokenizer.decode if tokenizer is not None else (lambda ids: ",".join(map(str, ids)))
