"""The demo's topic set: 400 short English sentences written for the zoo, 100 on each of four
topics (cooking, sport, weather, computing), shipped as datasets/topics.jsonl. Split with a
seeded shuffle within each topic, so every topic is held out in the same share.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from pathlib import Path

from registry.errors import ZooError
from registry.options import option
from runtime.files.atomic import atomic_folder
from runtime.files.labelled import Example, Rows, read_rows
from zoo.training.datasets import TOPICS

TRAIN, EVAL = "train.jsonl", "eval.jsonl"


def topic_split(rows: Rows, eval_fraction: float, seed: int) -> tuple[list[Example],
                                                                     list[Example]]:
    """(train, eval) in file order: `eval_fraction` of each label's rows held out."""
    if not 0 < eval_fraction < 1:
        raise ZooError(f"--eval-fraction {eval_fraction}: expected a number between 0 and 1")
    by_label: dict[str, list[int]] = {}
    for index, example in enumerate(rows.examples):
        by_label.setdefault(example.label, []).append(index)
    generator, held = random.Random(seed), set()
    for label in sorted(by_label):
        indices = by_label[label]
        generator.shuffle(indices)
        held.update(indices[:round(eval_fraction * len(indices))])
    return ([e for i, e in enumerate(rows.examples) if i not in held],
            [e for i, e in enumerate(rows.examples) if i in held])


def _jsonl(part: list[Example]) -> str:
    return "".join(json.dumps({"text": e.text, "label": e.label}) + "\n" for e in part)


@dataclass(frozen=True)
class TopicSetOptions:
    out: Path = option(help="Folder for train.jsonl and eval.jsonl.", flags=("-o", "--out"),
                       path="dir")
    eval_fraction: float = option(0.25, "Share of each topic's sentences held out.")
    seed: int = option(0, "Seed of the split.")
    force: bool = option(False, "Overwrite an existing folder.")


def topic_set_lines(options: TopicSetOptions, source: Path = TOPICS) -> list[str]:
    """`zoo dataset topics`: OUT/train.jsonl and OUT/eval.jsonl, written together atomically."""
    out = options.out
    train, held = topic_split(read_rows(source), options.eval_fraction, options.seed)
    with atomic_folder(Path(out), options.force) as staging:
        (staging / TRAIN).write_text(_jsonl(train), encoding="utf-8")
        (staging / EVAL).write_text(_jsonl(held), encoding="utf-8")
    labels = sorted({e.label for e in train + held})
    return [f"wrote {out}/ (train.jsonl: {len(train)} sentences, eval.jsonl: {len(held)}); "
            f"topics: {', '.join(labels)}"]
