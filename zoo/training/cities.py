"""The LoRA demo's chat set: each shipped city (datasets/cities.tsv) as a conversation that asks
to describe it and answers in one fixed JSON shape, `{"city": ..., "country": ...}`: a reply a
chat model does not give before it is tuned to. Split by a seeded shuffle, so the held-out
cities are never trained on.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from registry.errors import ZooError
from registry.options import option
from registry.paths import display_path
from runtime.files.atomic import atomic_folder
from runtime.files.labelled import held_out
from runtime.files.texts import text_lines
from zoo.training.datasets import CITIES
from zoo.training.topics import TopicSetOptions

TRAIN, EVAL = "train.jsonl", "eval.jsonl"


def read_cities(path: Path = CITIES) -> list[tuple[str, str]]:
    """(city, country) pairs, one `city<TAB>country` a line."""
    pairs = []
    for number, line in enumerate(text_lines(path, "city<TAB>country lines"), start=1):
        fields = line.split("\t")
        if len(fields) != 2 or not all(field.strip() for field in fields):
            raise ZooError(f"{display_path(path)}:{number}: expected city<TAB>country")
        pairs.append((fields[0].strip(), fields[1].strip()))
    return pairs


def conversation(city: str, country: str) -> dict[str, list[dict[str, str]]]:
    """One row of the set: the question and the answer in its fixed shape."""
    answer = json.dumps({"city": city, "country": country})
    return {"messages": [{"role": "user", "content": f"Describe {city}."},
                         {"role": "assistant", "content": answer}]}


@dataclass(frozen=True)
class CitySetOptions(TopicSetOptions):  # the topic set's options, its held-out share by city
    eval_fraction: float = option(0.25, "Share of the cities held out.")


def city_set_lines(options: CitySetOptions, source: Path = CITIES) -> list[str]:
    """`zoo dataset cities`: OUT/train.jsonl and OUT/eval.jsonl, written together atomically."""
    pairs = read_cities(source)
    held = held_out(len(pairs), options.eval_fraction, options.seed, display_path(source))
    parts = {TRAIN: [p for i, p in enumerate(pairs) if i not in held],
             EVAL: [p for i, p in enumerate(pairs) if i in held]}
    with atomic_folder(Path(options.out), options.force) as staging:
        for name, part in parts.items():
            (staging / name).write_text("".join(json.dumps(conversation(*pair)) + "\n"
                                                for pair in part), encoding="utf-8")
    return [f"wrote {options.out}/ (train.jsonl: {len(parts[TRAIN])} conversations, eval.jsonl: "
            f"{len(parts[EVAL])}); each asks to describe a city and answers "
            '{"city": ..., "country": ...}']
