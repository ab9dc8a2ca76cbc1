"""The types of the JSON values the importers read from a checkpoint's files (config.json,
modules.json, a Pooling module's config.json), checked before any of them is used, as the
card schema checks a card's: a value of another type is one line naming the file, the key and
the type expected (`architectures: 5` once reached `set(architectures)` as a TypeError).

Values that become card fields are validated again, with their bounds, as the card's; this
check comes first because the importers' own code meets them earlier (hashing a name,
comparing a size). A key that is absent, or null, is left to the reader's default."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from registry.errors import ZooError
from registry.layouts import MISSING, LayoutMap, lookup
from registry.schema import FIELDS


def _whole(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


# kind -> (as the error says it, the test)
KINDS: dict[str, tuple[str, Callable[[Any], bool]]] = {
    "int": ("a whole number", _whole),
    "number": ("a number", _number),
    "str": ("a string", lambda value: isinstance(value, str)),
    "bool": ("true or false", lambda value: isinstance(value, bool)),
    "object": ("an object", lambda value: isinstance(value, dict)),
    "list[str]": ("a list of strings",
                  lambda value: isinstance(value, list) and all(isinstance(v, str)
                                                                for v in value)),
    "object[str]": ("an object of strings",
                    lambda value: isinstance(value, dict) and all(isinstance(v, str)
                                                                  for v in value.values())),
    # a layer pattern: each layer's type, or every n-th layer global (ModernBERT's)
    "pattern": ("a list of layer types or a whole number",
                lambda value: _whole(value) or (isinstance(value, list)
                                                and all(isinstance(v, str) for v in value))),
    # a token id: Llama 3 lists several end-of-sequence ids
    "id": ("a token id or a list of them",
           lambda value: _whole(value) or (isinstance(value, list)
                                           and all(_whole(v) for v in value))),
}
CARD_KINDS = {int: "int", float: "number", str: "str", bool: "bool", dict: "object"}
# Read from every config.json, whatever its layout: which map, and a classifier's classes.
CONFIG = {"model_type": "str", "architectures": "list[str]", "id2label": "object[str]"}
SCALING_KEYS = ("rope_type", "type")  # the kind of a rope_scaling object


def check_types(data: dict[str, Any], kinds: dict[str, str], where: str, prefix: str = ""
                ) -> None:
    """Each key of `kinds` (dotted: into nested objects) that `data` sets, not null, of its
    kind; else one line: `where: KEY should be KIND, got VALUE`."""
    for key, kind in kinds.items():
        value = lookup(data, key)
        if value is MISSING or value is None:
            continue
        said, test = KINDS[kind]
        if not test(value):
            raise ZooError(f"{where}: {prefix}{key} should be {said}, got {_shown(value)}")


def config_kinds(layout: LayoutMap) -> dict[str, str]:
    """{config.json key: kind} of every key `layout` reads: its card fields' keys (of the
    field's type), a rope scaling's kind, the token ids, and the keys of every layout."""
    kinds = dict(CONFIG)
    for field, keys in layout["config"].items():
        field = field.rpartition(".")[2]  # a nested card's field (`vision.d_model`)
        kind = CARD_KINDS.get(FIELDS[field].type) if field in FIELDS else None
        kind = "pattern" if field == "attention_pattern" else kind
        if field == "rope_theta_local":  # a number, or rope_parameters' object (importers.py)
            kind = None
        for key in keys if isinstance(keys, list) else [keys]:
            if kind is not None:
                kinds.setdefault(key, kind)
            if field == "rope_scaling":
                kinds.update({f"{key}.{name}": "str" for name in SCALING_KEYS})
    if "pooling_key" in layout["classifier"]:
        kinds[layout["classifier"]["pooling_key"]] = "str"
    for spec in layout["tokens"].values():
        keys = spec.get("config", [])
        kinds.update({key: "id" for key in (keys if isinstance(keys, list) else [keys])})
    return kinds


def _shown(value: Any, limit: int = 40) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[:limit] + "..."
