"""Find cards in their folders, resolve `extends` chains and validate the result.

Folders, in order: the shipped `registry/cards`, plugin folders, `ZOO_PATH` (os.pathsep-separated)
and any `--registry DIR`. A card's name is its file name without `.yaml`; two files with one name
are an error naming both.
"""

from __future__ import annotations

import difflib
import fnmatch
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from registry.errors import CardError, first_line
from registry.paths import display_path
from registry.plugins import load_plugins
from registry.schema import check_known_fields, validate

SHIPPED = Path(__file__).parent / "cards"
SUFFIX = ".yaml"


@dataclass
class Card:
    """A resolved, validated card: every field set, and where each value came from."""

    name: str
    path: Path
    fields: dict[str, Any]
    origins: dict[str, str] = field(default_factory=dict)

    @property
    def family(self) -> str:
        return self.fields["family"]

    def __getitem__(self, key: str) -> Any:
        return self.fields[key]


def read_yaml(path: Path) -> dict[str, Any]:
    """Parse one YAML mapping safely, naming the file and line on error."""
    where = display_path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise CardError(f"{where}: cannot read: {exc}") from exc
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        line = f" line {mark.line + 1}" if mark else ""
        problem = getattr(exc, "problem", None) or first_line(exc)
        raise CardError(f"{where}:{line} malformed YAML: {problem}") from exc
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise CardError(f"{where}: should be a mapping of field: value, got {type(data).__name__}")
    return data


def card_from_file(path: Path) -> Card:
    """A fully resolved card file (a built model's config.yaml): no `extends` allowed."""
    data = read_yaml(path)
    where = display_path(path)
    name = data.pop("name", path.parent.name)
    if "extends" in data:
        raise CardError(f"{where}: a resolved config may not use 'extends'")
    fields = validate(data, where)
    return Card(str(name), path, fields, {key: where for key in data})


class Catalog:
    def __init__(self, folders: list[Path]) -> None:
        self.files: dict[str, Path] = {}
        unique = {folder.resolve(): folder for folder in reversed(folders)}  # first one wins
        for folder in reversed(unique.values()):
            for path in sorted(folder.glob(f"*{SUFFIX}")):
                name = path.name[: -len(SUFFIX)]
                if name in self.files:
                    raise CardError(f"duplicate card name '{name}': "
                                    f"{display_path(self.files[name])} and {display_path(path)}")
                self.files[name] = path

    def names(self, pattern: str = "*") -> list[str]:
        return sorted(name for name in self.files if fnmatch.fnmatchcase(name, pattern))

    def path(self, name: str) -> Path:
        if name not in self.files:
            close = difflib.get_close_matches(name, list(self.files), n=3, cutoff=0.5)
            hint = f" (did you mean {', '.join(close)}?)" if close else ""
            raise CardError(f"unknown card '{name}'{hint}; `zoo list` shows them all")
        return self.files[name]

    def get(self, name: str, overrides: dict[str, Any] | None = None) -> Card:
        """Resolve `name` along its `extends` chain, apply overrides, validate."""
        chain = self._chain(name)
        merged: dict[str, Any] = {}
        origins: dict[str, str] = {}
        for card_name in reversed(chain):  # root first, the card itself last
            path = self.files[card_name]
            data = read_yaml(path)
            data.pop("extends", None)
            check_known_fields(data, display_path(path))
            merged.update(data)
            origins.update({key: display_path(path) for key in data})
        if overrides:
            check_known_fields(overrides, "--set")
            merged.update(overrides)
            origins.update({key: "--set" for key in overrides})
        leaf = display_path(self.files[name])
        fields = validate(merged, leaf, origins)
        origins = {key: origins.get(key, "default") for key in fields}
        return Card(name, self.files[name], fields, origins)

    def _chain(self, name: str) -> list[str]:
        """[name, parent, grandparent, ...], refusing cycles and unknown parents."""
        chain = [name]
        self.path(name)
        while True:
            path = self.files[chain[-1]]
            parent = read_yaml(path).get("extends")
            if parent is None:
                return chain
            if not isinstance(parent, str):
                raise CardError(f"{display_path(path)}: extends={parent!r} should be a card name")
            if parent in chain:
                cycle = " -> ".join([*chain, parent])
                raise CardError(f"{display_path(path)}: extends cycle: {cycle}")
            try:
                self.path(parent)
            except CardError as exc:
                raise CardError(f"{display_path(path)}: extends: {exc}") from exc
            chain.append(parent)


def card_folders(extra: list[str | Path] | tuple[str | Path, ...] = ()) -> list[Path]:
    """Every folder cards come from, in order; folders that do not exist are an error."""
    folders = [SHIPPED, *load_plugins()]
    from_env = [p for p in os.environ.get("ZOO_PATH", "").split(os.pathsep) if p]
    for source, items in (("ZOO_PATH", from_env), ("--registry", list(extra))):
        for item in items:
            folder = Path(item)
            if not folder.is_dir():
                raise CardError(f"{source}: card folder {item} does not exist")
            folders.append(folder)
    return folders


def open_catalog(extra: list[str | Path] | tuple[str | Path, ...] = ()) -> Catalog:
    return Catalog(card_folders(extra))
