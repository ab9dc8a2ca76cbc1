"""Conversations for `zoo train --task chat`: JSONL rows `{"messages": [{"role", "content"},
...]}`, each checked and refused in one line naming file:line and field, and put in a model's
chat template by the renderer `zoo run --chat` uses (runtime/files/chat_worker.py
`render_chat`), as token ids with the mask of the tokens a model is trained to write.

The mask is found as transformers' `return_assistant_tokens_mask` finds its spans, by
characters of the whole rendered text, but with the template as it is (no `{% generation %}`
marks needed): for the assistant turn at index i, the conversation up to it rendered with the
generation prompt ends where the reply begins, and the conversation through it rendered
without one ends where the turn ends. The mask holds each reply's tokens through the first
end token (the card's eos_token_id, where `zoo run` stops) inside its turn, and none of the
system, user or tool tokens, the template's markers, or what the template writes after it."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from registry.errors import ZooError
from registry.paths import display_path, inside
from runtime.files.chat import CHAT_TEMPLATE
from runtime.files.chat_worker import render_chat
from runtime.files.texts import json_objects, shown, text_lines
from runtime.files.tokenizer import HuggingFaceTokenizer, Tokenizer

ROLES = ("system", "user", "assistant", "tool")
TRAINED_ROLE = "assistant"


@dataclass(frozen=True)
class Conversation:
    messages: list[dict[str, str]]
    line: int  # in its file, for errors


@dataclass(frozen=True)
class Conversations:
    where: str  # the file, as errors show it
    rows: list[Conversation]


@dataclass(frozen=True)
class Rendered:
    ids: list[int]
    trained: list[bool]  # per token: part of an assistant's reply (its content and end token)


def _messages(where: str, line: int, row: Any) -> list[dict[str, str]]:
    if not isinstance(row, dict) or not isinstance(row.get("messages"), list):
        given = row.get("messages") if isinstance(row, dict) else row
        raise ZooError(f"{where}:{line}: messages: expected a list of {{role, content}} "
                       f"objects, got {shown(given)}")
    messages = row["messages"]
    for index, message in enumerate(messages):
        field = f"{where}:{line}: messages[{index}]"
        if not isinstance(message, dict):
            raise ZooError(f"{field}: expected an object with role and content, got "
                           f"{shown(message)}")
        if message.get("role") not in ROLES:
            raise ZooError(f"{field}.role: expected one of {', '.join(ROLES)}, got "
                           f"{shown(message.get('role'))}")
        if not isinstance(message.get("content"), str):
            raise ZooError(f"{field}.content: expected a string, got "
                           f"{shown(message.get('content'))}")
    if not any(message["role"] == TRAINED_ROLE for message in messages):
        raise ZooError(f"{where}:{line}: messages: no assistant turn (the loss is on the "
                       "assistant's tokens)")
    return [{"role": m["role"], "content": m["content"]} for m in messages]


def read_conversations(path: Path) -> Conversations:
    """Every conversation of a JSONL file, each checked."""
    where = display_path(path)
    lines = text_lines(Path(path), 'JSONL rows of {"messages": [...]}')
    rows = [Conversation(_messages(where, number, row), number)
            for number, row in json_objects(where, lines)]
    if not rows:
        raise ZooError(f"{where}: no conversations (expected {{\"messages\": [...]}} a line)")
    return Conversations(where, rows)


def template_specials(tokenizer: Tokenizer, bos_id: int | None, eos_id: int | None
                      ) -> tuple[str, str]:
    """The `bos_token` and `eos_token` a template reads: the card's tokens as text."""
    return tuple(tokenizer.label(token) if token is not None else ""  # type: ignore[return-value]
                 for token in (bos_id, eos_id))


def chat_files(folder: Path) -> tuple[Path, HuggingFaceTokenizer]:
    """A folder's chat template and tokenizer.json, refused in one line where it lacks them."""
    from runtime.files.tokenizer import load_tokenizer

    template = inside(folder, CHAT_TEMPLATE, display_path(folder), "chat template")
    tokenizer = load_tokenizer(folder) if folder.is_dir() else None
    if not template.is_file() or not isinstance(tokenizer, HuggingFaceTokenizer):
        raise ZooError(f"{display_path(folder)}: no chat template (chat_template.jinja and "
                       "tokenizer.json)")
    return template, tokenizer


class ChatRenderer:
    """Conversations as a model reads them: its template, its tokenizer, its end token."""

    def __init__(self, template: Path, tokenizer: HuggingFaceTokenizer, bos_id: int | None,
                 eos_id: int | None) -> None:
        if eos_id is None:
            raise ZooError(f"{display_path(template)}: --task chat needs the card's "
                           "eos_token_id (the token that ends a reply)")
        self.template, self.tokenizer, self.eos = template, tokenizer, eos_id
        self.bos_text, self.eos_text = template_specials(tokenizer, bos_id, eos_id)

    def text(self, messages: list[dict[str, str]], generation_prompt: bool) -> str:
        return render_chat(self.template, messages, self.bos_text, self.eos_text,
                           generation_prompt=generation_prompt)

    def reply_spans(self, where: str, messages: list[dict[str, str]]
                    ) -> tuple[str, list[tuple[int, int]]]:
        """(the whole conversation's text, each assistant turn's (start, end) characters)."""
        whole = self.text(messages, generation_prompt=False)
        spans = []
        for index, message in enumerate(messages):
            if message["role"] != TRAINED_ROLE:
                continue
            prompt = self.text(messages[:index], generation_prompt=True)
            through = self.text(messages[:index + 1], generation_prompt=False)
            if not (through.startswith(prompt) and whole.startswith(through)):
                raise ZooError(f"{where}: messages[{index}]: the chat template renders the "
                               "conversation up to this reply other than as the start of the "
                               "whole, so the reply's tokens cannot be told apart")
            spans.append((len(prompt), len(through)))
        return whole, spans

    def render(self, where: str, messages: list[dict[str, str]]) -> Rendered:
        """The conversation's ids and, per token, whether it is trained: the tokens of each
        reply's span up to and including its first end token."""
        whole, spans = self.reply_spans(where, messages)
        encoding = self.tokenizer.backend.encode(whole, add_special_tokens=False)
        ids, offsets = encoding.ids, encoding.offsets
        trained = [False] * len(ids)
        for index, (start, end) in enumerate(spans):
            inside_turn = [t for t, (first, last) in enumerate(offsets)
                           if first < end and last > start]  # a token overlapping the turn
            ends = [t for t in inside_turn if ids[t] == self.eos]
            if not ends:
                raise ZooError(f"{where}: assistant turn {index + 1}: the chat template ends "
                               f"it without the end token {self.eos_text!r} (eos_token_id "
                               f"{self.eos}), so the model would not learn to stop")
            for t in inside_turn:
                if t <= ends[0]:
                    trained[t] = True
        return Rendered(ids, trained)
