"""Where a model comes from: a folder holding config.yaml (built, trained or imported), or a
card name to build with a seed. A folder with a LoRA adapter beside its weights (PEFT's
adapter_config.json and adapter_model.safetensors: `zoo train --lora`, `zoo import --adapter`)
gives its base with the adapter merged into the weights. A sharded checkpoint folder (`zoo
train --shard full`: shards.json) is consolidated into a temporary folder and loaded."""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

from torch import nn

from registry.catalog import Card, open_catalog
from registry.errors import ZooError
from registry.paths import display_path
from runtime.contract import MANIFEST
from zoo.assemble import build_model
from zoo.files.peft_adapter import ADAPTER_CONFIG, apply_adapter, attach_adapter
from zoo.files.weights import CONFIG, load_built, load_card
from zoo.training.checkpoints import SHARDS


def load_source(source: str, registries: tuple[str, ...] | list[str] = (), seed: int = 0,
                overrides: dict[str, Any] | None = None, merge: bool = True
                ) -> tuple[nn.Module, Card]:
    """A folder's model (its adapter merged, or with `merge` False kept apart) or a card's."""
    folder = Path(source)
    if (folder / SHARDS).is_file():  # a --shard full checkpoint, consolidated first
        return _load_sharded(folder, overrides)
    if (folder / CONFIG).is_file():
        if overrides:  # its weights were made for its own card: a changed field would not fit
            raise ZooError(f"{display_path(folder)}: --set {', '.join(sorted(overrides))}: a "
                           "model folder keeps the card it was built with; --set applies to "
                           "a card name")
        return load_folder(folder, merge)
    card = open_catalog(registries).get(source, overrides)
    return build_model(card, seed=seed), card


def source_card(source: str, registries: tuple[str, ...] | list[str] = ()) -> Card:
    """The card `load_source` would give, read without building anything (a folder's
    config.yaml: built, trained, imported, exported or a sharded checkpoint's), so a command
    can refuse a family it has nothing for before seconds of work."""
    folder = Path(source)
    if (folder / CONFIG).is_file() or (folder / MANIFEST).is_file():  # an export's: its card
        return load_card(folder)
    return open_catalog(registries).get(source)


def _load_sharded(folder: Path, overrides: dict[str, Any] | None) -> tuple[nn.Module, Card]:
    from zoo.training.sharded_checkpoints import consolidate_folder

    if overrides:
        raise ZooError(f"{display_path(folder)}: --set applies to a card name, not a checkpoint")
    with tempfile.TemporaryDirectory() as temporary:
        consolidate_folder(folder, Path(temporary) / "model")
        return load_folder(Path(temporary) / "model")


def load_folder(folder: Path, merge: bool = True) -> tuple[nn.Module, Card]:
    """A model folder's module and card, its LoRA adapter (if it has one) merged, or with
    `merge` False kept apart on its linears (zoo/blocks/lora.py LoRALinear)."""
    model, card = load_built(folder)
    if (folder / ADAPTER_CONFIG).is_file():
        adapted = apply_adapter if merge else attach_adapter
        model = adapted(model, card, folder).eval()
    return model, card


def build(card: str | Card, seed: int = 0, sets: dict[str, Any] | None = None,
          registries: tuple[str, ...] | list[str] = ()) -> nn.Module:
    """`zoo.build`: the module of a card (by name, with `sets` overriding its fields as
    `--set` does, or a Card), initialised from `seed`, in eval mode."""
    if isinstance(card, str):
        card = open_catalog(registries).get(card, sets)
    elif sets:
        raise ZooError(f"{card.name}: sets= applies to a card name; a Card is built as it is")
    return build_model(card, seed=seed)
