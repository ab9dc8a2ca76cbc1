"""The grammar engine, llguidance (as ONNX Runtime GenAI and llama.cpp use it), over the
export's own tokenizer: a grammar compiled once per request, a `Constraint` per generated row
that masks the logits before a token is picked and follows the tokens picked.

llguidance over xgrammar: both compute a 49k-vocabulary mask in tens of microseconds, but
xgrammar's wheel needs torch, transformers and triton, and runtime/ runs without torch;
llguidance is one 3 MB wheel with no dependencies, reads a tokenizer.json itself, and refuses
unimplemented JSON Schema keywords (BENCHMARKS.md has the two side by side)."""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass
from typing import Any

import numpy as np

from registry.catalog import Card
from registry.errors import ZooError, first_line
from runtime.files.tokenizer import ByteTokenizer, HuggingFaceTokenizer, Tokenizer
from runtime.grammar.schema import SchemaError, check_schema

# Compact JSON: no whitespace between tokens, so a small model cannot spend its answer on
# spaces and newlines (llguidance's default allows any run of them).
JSON_OPTIONS = {"whitespace_flexible": False, "item_separator": ",", "key_separator": ":"}
MAX_PATTERN = 10_000  # characters in a regular expression
MAX_SCHEMA_BYTES = 1 << 20  # as `zoo serve`'s whole body


class GrammarError(ZooError):
    """A grammar that cannot be enforced; `where` names the field or the schema's path."""

    def __init__(self, where: str, message: str) -> None:
        super().__init__(f"{where}: {message}")
        self.where = where


@dataclass(frozen=True)
class Grammar:
    """What a request's answer must match, as llguidance's grammar text."""

    text: str
    where: str  # the field that asked for it, named in errors


def json_grammar(schema: Any, where: str) -> Grammar:
    """Any JSON object (`schema` None, OpenAI's json_object) or one valid against `schema`."""
    import llguidance

    if schema is None:
        schema = {"type": "object"}
    try:
        check_schema(schema)
    except SchemaError as exc:
        raise GrammarError(where, str(exc)) from None
    text = llguidance.LLMatcher.grammar_from_json_schema(json.dumps(schema),
                                                         overrides=JSON_OPTIONS)  # type: ignore[arg-type]
    return Grammar(text, where)


def regex_grammar(pattern: str, where: str) -> Grammar:
    """Text matching `pattern` as a whole (Rust's regex syntax: no look-around, no
    backreferences)."""
    import llguidance

    if not pattern or len(pattern) > MAX_PATTERN:
        raise GrammarError(where, f"expected a regular expression of 1 to {MAX_PATTERN} "
                           "characters")
    return Grammar(llguidance.LLMatcher.grammar_from_regex(pattern), where)


def lark_grammar(lark: str, where: str) -> Grammar:
    import llguidance

    return Grammar(llguidance.LLMatcher.grammar_from_lark(lark), where)


def read_schema_file(text: str) -> str:
    """--json-schema FILE: the schema's JSON text (a ValueError says why it cannot be read)."""
    from pathlib import Path

    path = Path(text)
    try:
        if path.stat().st_size > MAX_SCHEMA_BYTES:
            raise ValueError(f"over {MAX_SCHEMA_BYTES} bytes")
        source = path.read_text(encoding="utf-8")
        json.loads(source)
    except OSError as exc:
        raise ValueError(f"cannot be read ({exc.strerror or first_line(exc)})") from None
    except UnicodeDecodeError:
        raise ValueError("not UTF-8 text") from None
    except RecursionError:
        raise ValueError("nested too deep to read") from None
    except json.JSONDecodeError as exc:
        raise ValueError(f"not valid JSON ({exc.msg} at line {exc.lineno})") from None
    return source


class Constraint:
    """One row's grammar state: `mask` the logits before picking, `advance` with the token
    picked. Once the grammar is complete only eos is allowed, so the row ends there."""

    def __init__(self, matcher: Any, vocab: int) -> None:
        self.matcher, self.vocab = matcher, vocab
        self.bits = np.zeros((1, (vocab + 31) // 32), np.int32)

    def allowed(self) -> np.ndarray:
        """(vocab,) booleans: the tokens the grammar allows next."""
        from llguidance.numpy import fill_next_token_bitmask

        fill_next_token_bitmask(self.matcher, self.bits)
        return np.unpackbits(self.bits.view(np.uint8), bitorder="little")[:self.vocab] \
            .astype(bool)

    def mask(self, logits: np.ndarray) -> np.ndarray:
        """A copy of one row's (vocab,) logits with every token the grammar forbids at -inf;
        the logits of a larger vocabulary than the tokenizer's (padding rows) forbidden too."""
        allowed = self.allowed()
        masked = np.full(logits.shape, -np.inf, np.float32)
        width = min(len(allowed), len(logits))
        masked[:width] = np.where(allowed[:width], logits[:width], -np.inf)
        return masked

    def advance(self, token: int) -> None:
        if not self.matcher.consume_token(int(token)):
            raise RuntimeError(f"the grammar refused token {token} it allowed: "
                               f"{_said(self.matcher.get_error())}")


class Grammars:
    """An export's grammar engine: its tokenizer read once (0.4 s for a 49k vocabulary), then
    a Constraint per request."""

    def __init__(self, tokenizer: Tokenizer | None, card: Card, name: str) -> None:
        self.tokenizer, self.card, self.name = tokenizer, card, name
        self.table: Any = None
        self.lock = threading.Lock()

    def _table(self) -> Any:
        with self.lock:
            if self.table is None:
                self.table = engine_tokenizer(self.tokenizer, self.card, self.name)
            return self.table

    def constraint(self, grammar: Grammar) -> Constraint:
        """A fresh row state for `grammar`, refused (GrammarError) where the engine cannot
        build it or no text can match it: before any token is decoded."""
        import llguidance

        matcher = llguidance.LLMatcher(self._table(), grammar.text, log_level=0)
        if matcher.is_error():
            raise GrammarError(grammar.where, _said(matcher.get_error()))
        constraint = Constraint(matcher, self.card["vocab_size"])
        if not constraint.allowed().any() or matcher.is_error():
            raise GrammarError(grammar.where, "no text can match it")
        return constraint


def engine_tokenizer(tokenizer: Tokenizer | None, card: Card, name: str) -> Any:
    """llguidance's view of the export's tokenizer: a tokenizer.json as it is, the byte
    tokenizer as its 256 bytes and special tokens."""
    import llguidance

    eos = card["eos_token_id"]
    if eos is None:
        raise ZooError(f"{name}: constrained decoding needs an eos token (the card sets none)")
    if isinstance(tokenizer, HuggingFaceTokenizer):
        try:
            return llguidance.LLTokenizer(tokenizer.backend.to_str(),
                                          n_vocab=card["vocab_size"], eos_token=eos)
        except ValueError as exc:  # a tokenizer.json kind it does not read
            raise ZooError(f"{name}: the grammar engine cannot read its tokenizer.json "
                           f"({_said(str(exc))})") from None
    if isinstance(tokenizer, ByteTokenizer):
        return llguidance.LLTokenizer(llguidance.TokenizerWrapper(_Bytes(tokenizer)))
    has = type(tokenizer).__name__ if tokenizer is not None else "none"
    raise ZooError(f"{name}: constrained decoding needs a tokenizer.json or the byte "
                   f"tokenizer; this export has {has}")


class _Bytes:
    """The byte tokenizer in the shape llguidance.TokenizerWrapper reads."""

    def __init__(self, tokenizer: ByteTokenizer) -> None:
        self.eos_token_id, self.bos_token_id = tokenizer.eos, tokenizer.bos
        specials = {tokenizer.pad: b"<pad>", tokenizer.bos: b"<s>", tokenizer.eos: b"</s>",
                    tokenizer.mask: b"<mask>"}
        self.tokens = [bytes([i]) if i < 256 else specials.get(i, b"<%d>" % i)
                       for i in range(tokenizer.vocab_size)]
        self.special_token_ids = sorted(specials)

    def __call__(self, text: str | bytes) -> list[int]:
        return list(text.encode("utf-8") if isinstance(text, str) else text)


def _said(message: str) -> str:
    """llguidance's error in one line: its lines joined, without its state and grammar dump
    or the carets under the regex it quotes."""
    message = message.split("<state>")[0].split("<grammar>")[0]
    lines = [line.strip() for line in message.splitlines()]
    return " ".join(line for line in lines if line.strip("^ ")).strip()[:300]
