"""The demo classification set made from what ships: speaker identification on the shipped
Shakespeare. Each speech (a `NAME:` line, then its lines, up to a blank line) is labelled with
its speaker; the most frequent speakers are the classes; speeches are split with a seeded
shuffle, so no speech is in both parts. The text without the held-out speeches is written too,
for pre-training that has never read them.
"""

from __future__ import annotations

import json
import random
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from registry.errors import ZooError
from registry.options import option
from runtime.files.atomic import atomic_folder
from zoo.training.data import SHIPPED_TEXT

TRAIN, EVAL, PRETRAIN = "train.jsonl", "eval.jsonl", "pretrain.txt"


@dataclass(frozen=True)
class Speech:
    speaker: str
    text: str  # the speech's lines joined by newlines, without the speaker's name
    block: str  # the speech as it stands in the file


def speeches(text: str) -> list[Speech]:
    """Every block whose first line is `NAME:` and that has lines after it."""
    found = []
    for block in text.split("\n\n"):
        lines = block.strip("\n").split("\n")
        if len(lines) > 1 and lines[0].endswith(":"):
            found.append(Speech(lines[0][:-1], "\n".join(lines[1:]), block))
    return found


@dataclass
class SpeakerSet:
    train: list[Speech]
    eval: list[Speech]
    classes: list[str]  # most frequent first
    pretrain: str  # the text without the held-out speeches


def speaker_set(text: str, top: int, eval_fraction: float, seed: int) -> SpeakerSet:
    if top < 2:
        raise ZooError(f"--top {top}: a classifier needs two or more speakers")
    if not 0 < eval_fraction < 1:
        raise ZooError(f"--eval-fraction {eval_fraction}: expected a number between 0 and 1")
    every = speeches(text)
    counts = Counter(speech.speaker for speech in every)
    classes = [name for name, _ in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))[:top]]
    chosen = [speech for speech in every if speech.speaker in classes]
    order = list(range(len(chosen)))
    random.Random(seed).shuffle(order)
    held = set(order[:round(eval_fraction * len(chosen))])
    held_blocks = {chosen[i].block for i in held}
    pretrain = "\n\n".join(block for block in text.split("\n\n") if block not in held_blocks)
    return SpeakerSet([s for i, s in enumerate(chosen) if i not in held],
                      [s for i, s in enumerate(chosen) if i in held], classes, pretrain)


def _jsonl(part: list[Speech]) -> str:
    return "".join(json.dumps({"text": s.text, "label": s.speaker}) + "\n" for s in part)


def write_speaker_set(out: Path, top: int = 4, eval_fraction: float = 0.2, seed: int = 0,
                      force: bool = False, source: Path = SHIPPED_TEXT) -> SpeakerSet:
    """OUT/train.jsonl, OUT/eval.jsonl and OUT/pretrain.txt, written together atomically."""
    made = speaker_set(source.read_text(encoding="utf-8"), top, eval_fraction, seed)
    with atomic_folder(Path(out), force) as staging:
        (staging / TRAIN).write_text(_jsonl(made.train), encoding="utf-8")
        (staging / EVAL).write_text(_jsonl(made.eval), encoding="utf-8")
        (staging / PRETRAIN).write_text(made.pretrain, encoding="utf-8")
    return made


@dataclass(frozen=True)
class SpeakerSetOptions:
    out: Path = option(help="Folder for train.jsonl, eval.jsonl and pretrain.txt.",
                       flags=("-o", "--out"), path="dir")
    top: int = option(4, "The most frequent speakers kept.")
    eval_fraction: float = option(0.2, "Share of the speeches held out.")
    seed: int = option(0, "Seed of the split.")
    force: bool = option(False, "Overwrite an existing folder.")


def speaker_set_lines(options: SpeakerSetOptions) -> list[str]:
    """`zoo dataset speakers`: the set written, and what it holds."""
    out = options.out
    made = write_speaker_set(out, options.top, options.eval_fraction, options.seed,
                             options.force)
    counts = {name: sum(s.speaker == name for s in made.train) for name in made.classes}
    return [f"wrote {out}/ (train.jsonl: {len(made.train)} speeches, eval.jsonl: "
            f"{len(made.eval)}, pretrain.txt); classes: "
            + ", ".join(f"{name} ({count})" for name, count in counts.items())]
