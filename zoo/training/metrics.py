"""OUT/metrics.jsonl: one JSON object a line for each logged training step.

Each line holds `step`, `loss`, `lr` (the rate that step used) and `tokens_per_s`. Lines are
appended and flushed as training goes, so a killed run keeps what it logged; a resumed run first
drops the lines past its checkpoint, so the file never holds a step twice.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from registry.errors import ZooError
from registry.paths import display_path
from runtime.files.atomic import atomic_write_bytes
from runtime.files.texts import decoded

METRICS = "metrics.jsonl"


def append_metrics(out: Path, record: dict[str, Any]) -> None:
    with (Path(out) / METRICS).open("a", encoding="utf-8") as stream:
        stream.write(json.dumps(record) + "\n")
        stream.flush()


def truncate_metrics(out: Path, step: int) -> None:
    """Keep only the lines up to `step` (the checkpoint a resumed run starts from)."""
    path = Path(out) / METRICS
    if not path.is_file():
        return
    # a line garbled by a crash (bytes not UTF-8 among them) is dropped, not a traceback
    lines = path.read_bytes().decode("utf-8", errors="replace").split("\n")
    lines = [line for line in lines if line.strip()]
    kept = [line for line in lines if _step(line) <= step]
    if len(kept) != len(lines):
        atomic_write_bytes(path, "".join(line + "\n" for line in kept).encode("utf-8"))


def _step(line: str) -> float:
    """A line's step; a line cut short by a kill counts as past every checkpoint."""
    try:
        return int(json.loads(line)["step"])
    except (ValueError, TypeError, KeyError, OverflowError, RecursionError):
        return math.inf


def read_metrics(out: Path) -> list[dict[str, Any]]:
    """The records of OUT/metrics.jsonl, checked: a step and finite loss and lr on every line."""
    out = Path(out)
    if not out.is_dir():
        raise ZooError(f"{display_path(out)}: no such folder (expected a `zoo train` output)")
    path = out / METRICS
    if not path.is_file():
        raise ZooError(f"{display_path(out)}: no {METRICS} here (`zoo train -o` writes it)")
    records = []
    text = decoded(path.read_bytes(), display_path(path))
    for number, line in enumerate(text.split("\n"), start=1):
        if not line.strip():
            continue
        try:  # Infinity as a step, a 400-digit loss: OverflowError; [[[...: RecursionError
            record = json.loads(line)
            step, loss, lr = int(record["step"]), float(record["loss"]), float(record["lr"])
        except (ValueError, TypeError, KeyError, OverflowError, RecursionError) as exc:
            raise ZooError(f"{display_path(path)} line {number}: expected JSON with step, loss "
                           f"and lr ({type(exc).__name__})") from exc
        if records and step <= records[-1]["step"]:
            raise ZooError(f"{display_path(path)} line {number}: step {step} does not follow "
                           f"step {records[-1]['step']}")
        if not (math.isfinite(loss) and math.isfinite(lr)):
            raise ZooError(f"{display_path(path)} line {number}: loss or lr is not finite")
        records.append(record)
    if not records:
        raise ZooError(f"{display_path(path)}: empty")
    return records
