"""Texts to run a model on, one a row: plain lines (.txt and anything else), JSONL (an object a
line) or CSV (a header), with the text in a named field. Every bad row is one error naming the
file and line; `text_lines` is the one reading of a data file (labelled.py reads with it too).
"""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from registry.errors import ZooError
from registry.paths import display_path
from runtime.files.tokenizer import Tokenizer


@dataclass(frozen=True)
class TextRow:
    text: str
    line: int  # in its file, for errors


def text_lines(path: Path, expected: str) -> list[str]:
    """The file's lines, refusing a missing file, invalid UTF-8 (with its line) and no rows;
    `expected` says what rows the command wanted."""
    where = display_path(path)
    if not path.is_file():
        raise ZooError(f"{where}: no such data file")
    raw = path.read_bytes()
    for number, line in enumerate(raw.split(b"\n"), start=1):
        try:
            line.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise ZooError(f"{where}:{number}: not UTF-8 text (byte {exc.start} of the line)"
                           ) from exc
    text = raw.decode("utf-8").removeprefix("\ufeff")
    if not text.strip():
        raise ZooError(f"{where}: data file is empty (expected {expected})")
    return text.splitlines()


def _row(where: str, line: int, text: object, column: str) -> TextRow:
    if not isinstance(text, str) or not text.strip():
        raise ZooError(f"{where}:{line}: expected a non-empty '{column}', got {text!r}")
    return TextRow(text, line)


def _label(where: str, line: int, label: object, column: str) -> TextRow:
    """A label cell as text: a name, or a whole number (JSONL may write it as one)."""
    if isinstance(label, bool) or not isinstance(label, (str, int)) or not str(label).strip():
        raise ZooError(f"{where}:{line}: expected a '{column}' (a label name or a whole "
                       f"number), got {label!r}")
    return TextRow(str(label).strip(), line)


Cell = Callable[[str, int, object, str], TextRow]


def json_objects(where: str, lines: list[str]) -> Iterator[tuple[int, Any]]:
    """(line number, parsed value) for each non-blank line of a JSONL file; a line that is not
    JSON is one error naming file and line."""
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            yield number, json.loads(line)
        except json.JSONDecodeError as exc:
            raise ZooError(f"{where}:{number}: not a JSON object: {exc.msg}") from exc


def _jsonl(where: str, lines: list[str], column: str, read_cell: Cell = _row) -> list[TextRow]:
    rows = []
    for number, row in json_objects(where, lines):
        if not isinstance(row, dict) or column not in row:
            raise ZooError(f"{where}:{number}: expected an object with '{column}'")
        rows.append(read_cell(where, number, row[column], column))
    return rows


def _csv(where: str, lines: list[str], column: str, read_cell: Cell = _row) -> list[TextRow]:
    reader = csv.reader(io.StringIO("\n".join(lines) + "\n"))
    header = [name.strip() for name in next(reader, [])]
    if column not in header:
        raise ZooError(f"{where}:1: the CSV header {header} should name '{column}' "
                       "(or choose the column with --column)")
    at = header.index(column)
    rows = []
    try:
        for row in reader:
            if not any(cell.strip() for cell in row):
                continue
            if len(row) != len(header):
                raise ZooError(f"{where}:{reader.line_num}: {len(row)} columns, the header has "
                               f"{len(header)}")
            rows.append(read_cell(where, reader.line_num, row[at], column))
    except csv.Error as exc:
        raise ZooError(f"{where}:{reader.line_num}: not valid CSV: {exc}") from exc
    return rows


def read_texts(path: Path, column: str = "text") -> list[TextRow]:
    """Every row's text, in file order: .jsonl and .csv by their suffix, else one text a line
    (where an empty line is a bad row: it would be a vector of nothing)."""
    path = Path(path)
    where = display_path(path)
    suffix = path.suffix.lower()
    lines = text_lines(path, f"one text a line, JSONL or CSV with a '{column}' field")
    if suffix == ".jsonl":
        return _jsonl(where, lines, column)
    if suffix == ".csv":
        return _csv(where, lines, column)
    return [_row(where, number, line, "text") for number, line in enumerate(lines, start=1)]


def read_labels(path: Path, column: str) -> list[TextRow]:
    """Every row's label (as text) from the JSONL field or CSV column `column`, in file order;
    a plain text file has no columns to hold one."""
    path = Path(path)
    where = display_path(path)
    suffix = path.suffix.lower()
    if suffix not in (".jsonl", ".csv"):
        raise ZooError(f"{where}: labels are read from a .jsonl or .csv file (a '{column}' "
                       "field beside the text); this is one text a line")
    lines = text_lines(path, f"JSONL or CSV with a '{column}' field")
    return (_jsonl if suffix == ".jsonl" else _csv)(where, lines, column, _label)


def read_token_ids(path: Path, tokenizer: Tokenizer, min_tokens: int) -> list[int]:
    """The whole file as token ids, refusing files that cannot make one batch."""
    where = display_path(path)
    if not path.is_file():
        raise ZooError(f"{where}: no such data file")
    raw = path.read_bytes()
    if not raw.strip():
        raise ZooError(f"{where}: data file is empty")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ZooError(f"{where}: not UTF-8 text (byte {exc.start})") from exc
    ids = tokenizer.encode(text)
    if len(ids) < min_tokens:
        raise ZooError(f"{where}: {len(ids)} tokens is shorter than one batch "
                       f"({min_tokens} tokens); use a longer text or a smaller --batch-size")
    return ids
