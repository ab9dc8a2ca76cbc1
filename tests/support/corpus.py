"""Files of rows for `zoo embed` and `zoo classify`, and an export given the byte tokenizer."""

from __future__ import annotations

import shutil
from pathlib import Path

from runtime.files.tokenizer import BYTE_TOKENIZER, ByteTokenizer


def with_byte_tokenizer(export: Path, where: Path) -> Path:
    """A copy of an export in `where`, given the byte tokenizer its card's vocabulary is."""
    copy = where / "export"
    shutil.copytree(export, copy)
    (copy / BYTE_TOKENIZER).write_text(ByteTokenizer().to_json())
    return copy


def lines_file(path: Path, texts: list[str]) -> Path:
    path.write_text("".join(text + "\n" for text in texts), encoding="utf-8")
    return path
