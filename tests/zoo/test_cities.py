"""The LoRA demo's chat set (zoo dataset cities): the shipped city list, read here with csv,
as conversations whose answers parse (json) to the listed city and country; the split holds
each city out once, by a seeded shuffle."""

from __future__ import annotations

import csv
import json
from pathlib import Path

from tests.support.helpers import zoo, zoo_ok
from zoo.training.cities import EVAL, TRAIN
from zoo.training.datasets import CITIES


def shipped() -> list[tuple[str, str]]:
    with CITIES.open(encoding="utf-8", newline="") as stream:
        return [(city, country) for city, country in csv.reader(stream, delimiter="\t")]


def pairs(path: Path) -> list[tuple[str, str]]:
    found = []
    for line in path.read_text(encoding="utf-8").splitlines():
        question, answer = json.loads(line)["messages"]
        assert question["role"] == "user" and answer["role"] == "assistant"
        parsed = json.loads(answer["content"])
        assert list(parsed) == ["city", "country"]
        assert question["content"] == f"Describe {parsed['city']}."
        found.append((parsed["city"], parsed["country"]))
    return found


def test_the_shipped_list_is_a_few_hundred_distinct_cities() -> None:
    cities = shipped()
    assert 200 <= len(cities) <= 300
    assert len({city for city, _ in cities}) == len(cities)
    assert all(city.strip() == city and country.strip() == country and city and country
               for city, country in cities)


def test_each_city_is_a_conversation_in_exactly_one_part(tmp_path: Path) -> None:
    zoo_ok("dataset", "cities", "-o", tmp_path / "a", "--eval-fraction", "0.25", "--seed", "2")
    train, held = pairs(tmp_path / "a" / TRAIN), pairs(tmp_path / "a" / EVAL)
    assert sorted(train + held) == sorted(shipped()) and not set(train) & set(held)
    assert len(held) == round(0.25 * len(shipped()))
    zoo_ok("dataset", "cities", "-o", tmp_path / "b", "--eval-fraction", "0.25", "--seed", "2")
    assert pairs(tmp_path / "b" / EVAL) == held
    zoo_ok("dataset", "cities", "-o", tmp_path / "c", "--eval-fraction", "0.25", "--seed", "3")
    assert pairs(tmp_path / "c" / EVAL) != held
    again = zoo("dataset", "cities", "-o", tmp_path / "a")
    assert again.exit_code == 2 and "already exists" in again.stderr
