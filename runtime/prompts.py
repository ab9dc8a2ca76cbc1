"""The one check of prompts before any engine runs them, for every family: each token id inside
the vocabulary (ONNX Runtime's Gather fails on one past it and silently wraps a negative one)
and each prompt within max_positions; and a prompt's text valid Unicode.

Only the card and its family's spec (registry/families.py) are read here."""

from __future__ import annotations

from collections.abc import Sequence

from registry.catalog import Card
from registry.errors import ZooError
from registry.families import spec_of


def check_text(text: str, what: str = "--text") -> str:
    """`text` when it is valid Unicode; else one line. A command-line argument of bytes that
    are not UTF-8 arrives with surrogate escapes, which no tokenizer can encode."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        code = ord(text[exc.start])
        shown = f"byte 0x{code - 0xDC00:02x}" if 0xDC80 <= code <= 0xDCFF else f"U+{code:04X}"
        raise ZooError(f"{what}: not valid UTF-8 ({shown} at character {exc.start}); pass the "
                       "prompt as UTF-8 text") from None
    return text


def check_ids(card: Card, prompts: Sequence[Sequence[int]], what: str | None = None) -> None:
    """Every id of every prompt in 0..vocab_size-1 and no prompt past max_positions, whatever
    the family (a generator's new tokens are checked where it generates). `what` names the
    input in the error (`--ids`), else the card does."""
    vocab, limit = card["vocab_size"], card["max_positions"]
    where = what or card.name
    for prompt in prompts:
        bad = next((int(token) for token in prompt if not 0 <= token < vocab), None)
        if bad is not None:
            raise ZooError(f"{where}: token id {bad} is not in the vocabulary (token ids should "
                           f"be in 0..{vocab - 1})")
    longest = max((len(prompt) for prompt in prompts), default=0)
    if longest > limit:
        noun = spec_of(card).prompt_noun
        raise ZooError(f"{where}: {noun} of {longest} tokens exceeds max_positions={limit}")
