"""runtime/files/json_files.py's read_json, the one JSON reader behind preprocessor_config.json
(audio and images), generation_config.json and the importers' config.json: every file that
cannot be read or parsed is refused in one line naming it, in the caller's own error class."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from registry.errors import ZooError
from runtime.files.audio import AudioError, read_mel_settings
from runtime.files.images import ImageError, read_processor
from runtime.files.json_files import read_json

READERS: list[tuple[Callable[[Path], Any], type[ZooError]]] = [
    (read_json, ZooError), (read_mel_settings, AudioError), (read_processor, ImageError)]
BROKEN = {"truncated": b'{"a": [1, 2', "not UTF-8": b'{"a": "\xff"}',
          "nested too deeply": b"[" * 100_000 + b"]" * 100_000, "a directory": None}


@pytest.mark.parametrize(("reader", "error"), READERS)
@pytest.mark.parametrize("case", BROKEN)
def test_a_broken_json_file_is_one_line_naming_it(reader: Callable[[Path], Any],
                                                  error: type[ZooError], case: str,
                                                  tmp_path: Path) -> None:
    path = tmp_path / "preprocessor_config.json"
    content = BROKEN[case]
    if content is None:
        path.mkdir()
    else:
        path.write_bytes(content)
        # the reference: the json module refuses it too
        with pytest.raises((ValueError, RecursionError)):
            json.loads(content.decode("utf-8"))
    with pytest.raises(ZooError) as refused:
        reader(path)
    assert type(refused.value) is error
    message = str(refused.value)
    assert "\n" not in message and message.startswith(f"{path.resolve()}: "), message


def test_a_good_file_reads_as_the_json_module_reads_it(tmp_path: Path) -> None:
    value = {"a": [1, 2.5, None, "é"], "b": {"c": True}}
    path = tmp_path / "config.json"
    path.write_text(json.dumps(value), encoding="utf-8")
    assert read_json(path) == value
