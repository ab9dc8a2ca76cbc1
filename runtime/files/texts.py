"""Texts to run a model on, one a row: plain lines (.txt and anything else), JSONL (an object a
line) or CSV (a header), with the text in a named field. Every bad row is one error naming the
file and line; `text_lines` is the one reading of a data file and `csv_table` of a CSV one
(labelled.py reads with both).
"""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from registry.errors import ZooError, first_line
from registry.paths import display_path
from runtime.files.tokenizer import Tokenizer


@dataclass(frozen=True)
class TextRow:
    text: str
    line: int  # in its file, for errors


def file_text(path: Path, empty_note: str = "") -> str:
    """A data file's whole text, refusing a missing file, text that is not UTF-8 (with its
    line) and a file with nothing in it (`empty_note` says what was wanted)."""
    where = display_path(path)
    if not path.is_file():
        raise ZooError(f"{where}: no such data file")
    text = decoded(path.read_bytes(), where)
    if not text.strip():
        raise ZooError(f"{where}: data file is empty{empty_note}")
    return text


def text_lines(path: Path, expected: str) -> list[str]:
    """The file's lines (split at "\n" only, as line numbers count them), refusing a missing
    file, text that is not UTF-8 (with its line) and no rows; `expected` says what rows the
    command wanted."""
    text = file_text(path, f" (expected {expected})")
    lines = text.split("\n")
    if lines[-1] == "":
        lines.pop()  # the newline that ends the last line
    return [line.removesuffix("\r") for line in lines]


def decoded(raw: bytes, where: str) -> str:
    """UTF-8 text without its byte-order mark; UTF-16, bytes that are not UTF-8 and NUL bytes
    (binary data, or UTF-16 without a mark, which is valid UTF-8 byte by byte) refused at
    their line."""
    if raw.startswith((b"\xff\xfe", b"\xfe\xff")):
        raise ZooError(f"{where}: UTF-16 text (its byte-order mark); expected UTF-8")
    nul = raw.find(b"\0")
    try:
        text = raw[:nul].decode("utf-8") if nul >= 0 else raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        column = exc.start - raw.rfind(b"\n", 0, exc.start) - 1
        raise ZooError(f"{where}:{_line_at(raw, exc.start)}: not UTF-8 text (byte {column} of "
                       "the line)") from exc
    if nul >= 0:
        raise ZooError(f"{where}:{_line_at(raw, nul)}: a NUL byte (binary data, or UTF-16?); "
                       "expected UTF-8 text")
    return text.removeprefix("\ufeff")


def _line_at(raw: bytes, offset: int) -> int:
    return raw.count(b"\n", 0, offset) + 1


def shown(value: object, limit: int = 60) -> str:
    """A cell for an error line: its repr, cut (a JSONL cell may be a list of a million)."""
    text = repr(value)
    return text if len(text) <= limit else text[:limit] + "..."


def _row(where: str, line: int, text: object, column: str) -> TextRow:
    if not isinstance(text, str) or not text.strip():
        raise ZooError(f"{where}:{line}: expected a non-empty '{column}', got {shown(text)}")
    return TextRow(text, line)


def _label(where: str, line: int, label: object, column: str) -> TextRow:
    """A label cell as text: a name, or a whole number (JSONL may write it as one)."""
    if isinstance(label, bool) or not isinstance(label, (str, int)) or not str(label).strip():
        raise ZooError(f"{where}:{line}: expected a '{column}' (a label name or a whole "
                       f"number), got {shown(label)}")
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
        except RecursionError as exc:  # [[[[... past Python's stack
            raise ZooError(f"{where}:{number}: not a JSON object: nested too deeply") from exc
        except ValueError as exc:  # a number of more than 4300 digits
            raise ZooError(f"{where}:{number}: not a JSON object: "
                           f"{first_line(exc).split(';')[0]}") from exc


def _jsonl(where: str, lines: list[str], column: str, read_cell: Cell = _row) -> list[TextRow]:
    rows = []
    for number, row in json_objects(where, lines):
        if not isinstance(row, dict) or column not in row:
            raise ZooError(f"{where}:{number}: expected an object with '{column}'")
        rows.append(read_cell(where, number, row[column], column))
    return rows


def csv_records(where: str, lines: list[str]) -> Iterator[tuple[int, list[str]]]:
    """(line it starts on, cells) of each CSV record that is not blank, the header first. A
    quote never closed (which swallows the rest of the file into one field) or a stray one is
    one error naming the line where the record starts."""
    reader = csv.reader(io.StringIO("\n".join(lines) + "\n"), strict=True)
    start = 1
    while True:
        try:
            row = next(reader)
        except StopIteration:
            return
        except csv.Error as exc:
            raise ZooError(_csv_problem(where, start, str(exc))) from exc
        if any(cell.strip() for cell in row):
            yield start, row
        start = reader.line_num + 1


def _csv_problem(where: str, start: int, problem: str) -> str:
    if problem.startswith(("unexpected end of data", "field larger than field limit")):
        return (f"{where}:{start}: a quoted field opened here is never closed, or runs past "
                f"{csv.field_size_limit()} characters (expected a closing quote)")
    return f"{where}:{start}: not valid CSV: {problem}"


def csv_table(where: str, lines: list[str], columns: tuple[str, ...], choose: str = ""
              ) -> Iterator[tuple[int, list[str]]]:
    """(line, the cells of `columns`) of each row of a CSV file whose header names them all;
    `choose` says how to name another column, for the error."""
    records = csv_records(where, lines)
    start, cells = next(records, (1, []))
    header = [name.strip() for name in cells]
    if any(column not in header for column in columns):
        named = " and ".join(f"'{column}'" for column in columns)
        raise ZooError(f"{where}:{start}: the CSV header {shown(header, 200)} should name "
                       f"{named}{choose}")
    at = [header.index(column) for column in columns]
    for number, row in records:
        if len(row) != len(header):
            raise ZooError(f"{where}:{number}: {len(row)} columns, the header has {len(header)}")
        yield number, [row[i] for i in at]


def _csv(where: str, lines: list[str], column: str, read_cell: Cell = _row) -> list[TextRow]:
    return [read_cell(where, number, cells[0], column) for number, cells in
            csv_table(where, lines, (column,), " (or choose the column with --column)")]


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
    text = file_text(path)
    ids = tokenizer.encode(text)
    if len(ids) < min_tokens:
        raise ZooError(f"{where}: {len(ids)} tokens is shorter than one batch "
                       f"({min_tokens} tokens); use a longer text or a smaller --batch-size")
    return ids
