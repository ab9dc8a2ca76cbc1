"""The demo's topic set (zoo dataset topics): the shipped sentences, read here with json, split
within each topic by a seeded shuffle."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

from click.testing import CliRunner

from cli import main
from zoo.training.topics import EVAL, TOPICS, TRAIN

EXPECTED_TOPICS = {"cooking", "sport", "weather", "computing"}


def rows(path: Path) -> list[tuple[str, str]]:
    return [(row["text"], row["label"]) for row in
            map(json.loads, path.read_text(encoding="utf-8").splitlines())]


def write(out: Path, *options: str) -> object:
    return CliRunner().invoke(main, ["dataset", "topics", "-o", str(out), *options])


def test_the_shipped_set_is_100_distinct_short_sentences_a_topic() -> None:
    shipped = rows(TOPICS)
    assert Counter(label for _, label in shipped) == {topic: 100 for topic in EXPECTED_TOPICS}
    assert len({text for text, _ in shipped}) == len(shipped)
    assert all(0 < len(text) <= 120 for text, _ in shipped)


def test_each_topic_is_held_out_in_the_same_share_and_no_row_is_in_both(tmp_path: Path) -> None:
    result = write(tmp_path / "a", "--eval-fraction", "0.2", "--seed", "3")
    assert result.exit_code == 0, result.output
    train, held = rows(tmp_path / "a" / TRAIN), rows(tmp_path / "a" / EVAL)
    assert Counter(label for _, label in held) == {topic: 20 for topic in EXPECTED_TOPICS}
    assert sorted(train + held) == sorted(rows(TOPICS)) and not set(train) & set(held)
    assert write(tmp_path / "b", "--eval-fraction", "0.2", "--seed", "3").exit_code == 0
    assert rows(tmp_path / "b" / EVAL) == held
    assert write(tmp_path / "c", "--eval-fraction", "0.2", "--seed", "4").exit_code == 0
    assert rows(tmp_path / "c" / EVAL) != held


def test_a_bad_fraction_or_an_existing_folder_is_one_line(tmp_path: Path) -> None:
    for fraction in ("0", "1", "1.5"):
        result = write(tmp_path / "x", "--eval-fraction", fraction)
        assert result.exit_code == 2 and "--eval-fraction" in result.stderr
        assert not (tmp_path / "x").exists()
    assert write(tmp_path / "y").exit_code == 0
    again = write(tmp_path / "y")
    assert again.exit_code == 2 and "already exists" in again.stderr
