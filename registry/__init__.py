"""YAML cards: schema, loading, `extends`, validation, plugin discovery. Never imports torch."""

from registry.catalog import Card, Catalog, card_from_file, open_catalog
from registry.errors import CardError, ZooError
from registry.params import count_parameters, total_parameters

__all__ = [
    "Card",
    "CardError",
    "Catalog",
    "ZooError",
    "card_from_file",
    "count_parameters",
    "open_catalog",
    "total_parameters",
]
