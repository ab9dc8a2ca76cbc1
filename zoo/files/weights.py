"""safetensors in and out, with strict key and shape checks. No pickle is ever loaded.

A built model is a folder: `model.safetensors` plus the fully resolved `config.yaml`.
"""

from __future__ import annotations

from pathlib import Path

import torch
import yaml
from safetensors import SafetensorError
from safetensors.torch import load_file, save, save_file

from registry.catalog import Card, card_from_file
from registry.errors import ZooError
from registry.paths import display_path
from runtime.files.atomic import atomic_folder, current_umask
from zoo.assemble import build_model

WEIGHTS = "model.safetensors"
CONFIG = "config.yaml"


class WeightsError(ZooError):
    """A safetensors file that is missing, corrupt, or does not match the model."""


def _state_tensors(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {name: tensor.detach().contiguous().cpu() for name, tensor in
            model.state_dict().items()}


def weights_bytes(model: torch.nn.Module, metadata: dict[str, str] | None = None) -> bytes:
    """The model's tensors serialised; identical models give identical bytes."""
    return save(_state_tensors(model), metadata=metadata)


def write_weights(model: torch.nn.Module, path: Path,
                  metadata: dict[str, str] | None = None,
                  tensors: dict[str, torch.Tensor] | None = None) -> None:
    """weights_bytes(model) (or `tensors`, some of its own) written to `path` (a new file in
    a staging folder) straight from the tensors' memory: a second copy of a 4 GB model's
    bytes is what a 24 GiB machine cannot spare beside the export."""
    save_file(_state_tensors(model) if tensors is None else tensors, str(path),
              metadata=metadata)
    path.chmod(0o666 & ~current_umask())  # as the folder's other files (save_file: 0600)


def read_tensors(path: Path) -> dict[str, torch.Tensor]:
    if not path.is_file():
        raise WeightsError(f"{display_path(path)}: no such file")
    try:
        return load_file(str(path))
    except (SafetensorError, OSError, ValueError) as exc:
        raise WeightsError(f"{display_path(path)}: not a readable safetensors file: {exc}") from exc


def check_tensors(model: torch.nn.Module, tensors: dict[str, torch.Tensor], where: str) -> None:
    """Raise one line listing missing, unexpected and mis-shaped tensors by name."""
    expected = {name: tuple(t.shape) for name, t in model.state_dict().items()}
    missing = sorted(set(expected) - set(tensors))
    unexpected = sorted(set(tensors) - set(expected))
    misshaped = [
        f"{name} {tuple(tensors[name].shape)} != {expected[name]}"
        for name in sorted(set(expected) & set(tensors))
        if tuple(tensors[name].shape) != expected[name]
    ]
    problems = [
        f"{label}: {', '.join(items)}"
        for label, items in (("missing", missing), ("unexpected", unexpected),
                             ("mis-shaped", misshaped))
        if items
    ]
    if problems:
        raise WeightsError(f"{where}: " + "; ".join(problems))


def load_weights(model: torch.nn.Module, path: Path) -> None:
    tensors = read_tensors(path)
    check_tensors(model, tensors, display_path(path))
    model.load_state_dict(tensors, strict=True)


def card_yaml(card: Card) -> str:
    return yaml.safe_dump({"name": card.name, **card.fields}, sort_keys=False)


def save_built(model: torch.nn.Module, card: Card, out: Path, force: bool = False) -> Path:
    """Write `out/model.safetensors` and `out/config.yaml` together, atomically."""
    # One metadata key only: safetensors writes metadata in hash order, which varies per run.
    with atomic_folder(Path(out), force) as staging:
        write_weights(model, staging / WEIGHTS, metadata={"format": "pt"})
        (staging / CONFIG).write_text(card_yaml(card), encoding="utf-8")
    return Path(out) / WEIGHTS


def load_card(folder: Path) -> Card:
    folder = Path(folder)
    if not folder.is_dir():
        raise ZooError(f"{display_path(folder)}: no such folder")
    config = folder / CONFIG
    if not config.is_file():
        raise ZooError(f"{display_path(folder)}: not a built model (no {CONFIG})")
    return card_from_file(config)


def load_built(folder: Path) -> tuple[torch.nn.Module, Card]:
    """Load a folder written by `save_built` (or `zoo build`), checking every key and shape."""
    card = load_card(Path(folder))
    model = build_model(card, seed=None)
    load_weights(model, Path(folder) / WEIGHTS)
    return model.eval(), card


