"""Labelled text for `--task classify`: JSONL (`{"text": ..., "label": ...}` a line) or CSV
with a header holding `text` and `label` columns. Labels are names, or ids when every label in
the training file is a whole number. Every bad row is one error naming the file and line.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from registry.errors import ZooError
from registry.paths import display_path
from registry.schema import MAX_LABELS
from runtime.files.texts import csv_table, json_objects, shown, text_lines


@dataclass(frozen=True)
class Example:
    text: str
    label: str  # as written: a name, or an id's digits
    line: int  # in its file, for errors


@dataclass(frozen=True)
class Rows:
    where: str  # the file, as errors show it
    examples: list[Example]


def _example(where: str, line: int, text: Any, label: Any) -> Example:
    if not isinstance(text, str) or not text.strip():
        raise ZooError(f"{where}:{line}: expected a non-empty 'text', got {shown(text)}")
    if isinstance(label, bool) or not isinstance(label, (str, int)) or str(label).strip() == "":
        raise ZooError(f"{where}:{line}: expected a 'label' (a name or a whole number), "
                       f"got {shown(label)}")
    return Example(text, str(label).strip(), line)


def _jsonl(where: str, lines: list[str]) -> list[Example]:
    examples = []
    for number, row in json_objects(where, lines):
        if not isinstance(row, dict):
            raise ZooError(f"{where}:{number}: expected an object with 'text' and 'label'")
        examples.append(_example(where, number, row.get("text"), row.get("label")))
    return examples


def _csv(where: str, lines: list[str]) -> list[Example]:
    return [_example(where, number, text, label)
            for number, (text, label) in csv_table(where, lines, ("text", "label"))]


def read_rows(path: Path) -> Rows:
    """Every example of a JSONL or CSV file (told apart by the first character: `{`)."""
    where = display_path(path)
    lines = text_lines(Path(path), "JSONL or CSV rows of text, label")
    first = next(line for line in lines if line.strip()).lstrip()
    examples = _jsonl(where, lines) if first.startswith("{") else _csv(where, lines)
    if not examples:
        raise ZooError(f"{where}: no rows (expected text and label on each)")
    return Rows(where, examples)


def label_ids(rows: Rows, names: list[str] | None, num_labels: int) -> list[int]:
    """Each row's class id: by name when the classes have names, else the id as written;
    a label outside the classes is an error naming its line."""
    # One dict lookup a row: `names.index` made 10**5 distinct labels take minutes.
    index = {name: i for i, name in enumerate(names or [])}
    ids = []
    for example in rows.examples:
        found = index.get(example.label) if names is not None else _written_id(example.label)
        if found is None or found >= num_labels:
            known = _listing(names) if names is not None else f"ids 0..{num_labels - 1}"
            raise ZooError(f"{rows.where}:{example.line}: label {_shown(example.label)} is not "
                           f"one of the classes ({known})")
        ids.append(found)
    return ids


def _listing(names: list[str], shown: int = 12) -> str:
    """Names for one error line: the first few, then how many more."""
    more = f" (+{len(names) - shown} more)" if len(names) > shown else ""
    return ", ".join(names[:shown]) + more


def _shown(label: str, limit: int = 40) -> str:
    return repr(label if len(label) <= limit else label[:limit] + "...")


def _written_id(label: str) -> int | None:
    """The class id a label writes in ASCII digits (`'²'.isdigit()`, yet int() refuses it),
    else None; past 18 digits just "too large" (int() refuses 4300 digits)."""
    if not (label.isascii() and label.isdigit()):
        return None
    digits = label.lstrip("0") or "0"
    return int(digits) if len(digits) <= 18 else 10**18


def _id_count(rows: Rows, card_num_labels: int) -> int:
    """Classes for labels that are all ids: 0..the largest written, refused when that many
    could not be a classifier's head (a label 10**15 would ask for 10**15 rows of weights)."""
    largest = max(rows.examples, key=lambda example: _written_id(example.label) or 0)
    count = (_written_id(largest.label) or 0) + 1
    if count > MAX_LABELS:
        raise ZooError(f"{rows.where}:{largest.line}: label {_shown(largest.label)} is too "
                       f"large for a class id (at most {MAX_LABELS - 1}); number the classes "
                       "0..n-1 or name them")
    return max(card_num_labels, count)


def classes(rows: Rows, card_labels: list[str] | None, card_num_labels: int
            ) -> tuple[list[str] | None, int]:
    """(names or None, count) for training on `rows`: the card's own classes when it has them
    (a classifier trained further), else the names in sorted order, or the ids 0..max."""
    written = sorted({example.label for example in rows.examples})
    if len(written) < 2:
        raise ZooError(f"{rows.where}: only one label ({_shown(written[0])}); a classifier "
                       "needs two or more")
    if card_labels is not None:
        return card_labels, len(card_labels)
    if all(_written_id(label) is not None for label in written):
        return None, _id_count(rows, card_num_labels)
    return written, len(written)


def held_out(count: int, fraction: float, seed: int, where: str) -> set[int]:
    """The indices of `count` rows to hold out: a seeded shuffle, `fraction` of them (at least
    one, and not all)."""
    if not 0 < fraction < 1:
        raise ZooError(f"--eval-fraction {fraction}: expected a number between 0 and 1")
    order = list(range(count))
    random.Random(seed).shuffle(order)
    held = max(1, round(fraction * len(order)))
    if held >= len(order):
        raise ZooError(f"{where}: {len(order)} rows are too few to hold out {fraction}")
    return set(order[:held])


def split(rows: Rows, fraction: float, seed: int) -> tuple[Rows, Rows]:
    """(train, eval): a seeded shuffle of the rows, `fraction` of them (at least one) held out."""
    chosen = held_out(len(rows.examples), fraction, seed, rows.where)
    keep = [e for i, e in enumerate(rows.examples) if i not in chosen]
    return Rows(rows.where, keep), Rows(rows.where, [rows.examples[i] for i in sorted(chosen)])
