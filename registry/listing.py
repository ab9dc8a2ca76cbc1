"""`zoo list` and `zoo show`: cards as the command line prints them, from arithmetic on the
card alone (no torch, so both answer at once)."""

from __future__ import annotations

from collections.abc import Sequence

import yaml

from registry.catalog import Card, open_catalog
from registry.errors import ZooError
from registry.params import UnknownCount, active_parameters, count_parameters, total_parameters


def human(count: int | None) -> str:
    if count is None:
        return "?"
    for unit, size in (("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if count >= size:
            return f"{count / size:.1f}{unit}"
    return str(count)


def card_table(pattern: str, registries: Sequence[str] = ()) -> list[str]:
    """One line per card matching the wildcard: name, family, parameters, description."""
    catalog = open_catalog(tuple(registries))
    names = catalog.names(pattern)
    if not names:
        raise ZooError(f"no card matches '{pattern}'")
    rows = [("NAME", "FAMILY", "PARAMS", "DESCRIPTION")]
    for name in names:
        card = catalog.get(name)
        rows.append((name, card.family, human(total_parameters(card.fields)),
                     card["description"]))
    widths = [max(len(row[i]) for row in rows[1:] + [("NAME", "FAMILY", "PARAMS", "")])
              for i in range(3)]
    return [f"{row[0]:<{widths[0]}}  {row[1]:<{widths[1]}}  {row[2]:>{widths[2]}}  {row[3]}"
            for row in rows]


def card_report(card: Card) -> list[str]:
    """The resolved card, where each field came from, and its parameters per part."""
    lines = [f"# {card.name}  ({card.path})"]
    width = max(len(field) for field in card.fields)
    for field, value in card.fields.items():
        shown = yaml.safe_dump(value, default_flow_style=True).strip().removesuffix("...").strip()
        lines.append(f"{field:<{width}}  {shown:<24}  # {card.origins[field]}")
    try:
        parts = count_parameters(card.fields)
    except UnknownCount as exc:
        return [*lines, f"parameters: unknown (plugin block '{exc}' declares no count)"]
    total = sum(parts.values())
    active = active_parameters(card.fields)
    routed = [f"active per token: {active:,}"] if active is not None and active != total else []
    return [*lines, f"parameters: {total:,}",
            *(f"  {part:<16} {count:>14,}" for part, count in parts.items()), *routed]
