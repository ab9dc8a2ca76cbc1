"""A JSON file read in one place, for every reader of a folder's JSON files (config.json,
preprocessor_config.json, generation_config.json, modules.json): a file that cannot be read or
parsed is one line naming it, whatever the reader's own error class."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from registry.errors import ZooError, first_line
from registry.paths import display_path


def read_json(path: Path, error: type[ZooError] = ZooError) -> Any:
    """A JSON file's value; a file that cannot be read or parsed is one line naming it (JSON
    nested past Python's stack, or a number of over 4300 digits, too)."""
    where = display_path(path)
    try:
        return json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError) as exc:
        raise error(f"{where}: cannot read: {first_line(exc)}") from exc
    except json.JSONDecodeError as exc:
        raise error(f"{where}: not valid JSON: {exc}") from exc
    except RecursionError as exc:
        raise error(f"{where}: not valid JSON: nested too deeply") from exc
    except ValueError as exc:
        raise error(f"{where}: not valid JSON: {first_line(exc).split(';')[0]}") from exc
