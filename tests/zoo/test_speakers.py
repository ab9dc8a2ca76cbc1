"""The demo set (issue #11): speeches of the shipped Shakespeare labelled by speaker, split by
speech with a seed; checked against a count made here from the raw text."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

from zoo.training.data import SHIPPED_TEXT
from zoo.training.speakers import EVAL, PRETRAIN, TRAIN, write_speaker_set


def raw_speeches() -> list[tuple[str, str]]:
    """(speaker, speech) for every `NAME:` block, read independently of the module."""
    found = []
    for block in SHIPPED_TEXT.read_text(encoding="utf-8").split("\n\n"):
        lines = block.strip("\n").splitlines()
        if len(lines) > 1 and lines[0].endswith(":"):
            found.append((lines[0][:-1], "\n".join(lines[1:])))
    return found


def rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


def test_speaker_set_is_the_top_speakers_split_by_speech(tmp_path: Path) -> None:
    made = write_speaker_set(tmp_path / "a", top=3, eval_fraction=0.25, seed=5)
    counts = Counter(speaker for speaker, _ in raw_speeches())
    top = [name for name, _ in counts.most_common(3)]
    assert made.classes == top
    train, held = rows(tmp_path / "a" / TRAIN), rows(tmp_path / "a" / EVAL)
    assert len(train) + len(held) == sum(counts[name] for name in top)
    assert abs(len(held) - 0.25 * (len(train) + len(held))) <= 1
    assert {row["label"] for row in train} == {row["label"] for row in held} == set(top)
    every = Counter((s, t) for s, t in raw_speeches())
    both = Counter((r["label"], r["text"]) for r in train) & Counter(
        (r["label"], r["text"]) for r in held)
    assert all(every[key] > 1 for key in both)  # only speeches that occur twice in the play
    blocks = {block.strip("\n") for block in
              (tmp_path / "a" / PRETRAIN).read_text(encoding="utf-8").split("\n\n")}
    as_block = lambda row: f"{row['label']}:\n{row['text']}"  # noqa: E731
    assert not any(as_block(row) in blocks for row in held
                   if every[(row["label"], row["text"])] == 1)
    assert all(as_block(row) in blocks for row in train)
    again = write_speaker_set(tmp_path / "b", top=3, eval_fraction=0.25, seed=5)
    assert [s.text for s in again.eval] == [s.text for s in made.eval]
    other = write_speaker_set(tmp_path / "c", top=3, eval_fraction=0.25, seed=6)
    assert [s.text for s in other.eval] != [s.text for s in made.eval]
