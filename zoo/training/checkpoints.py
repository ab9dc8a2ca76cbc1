"""Training checkpoints: model, optimizer state and trainer state, never pickled.

Layout of a training folder OUT:
    config.yaml, model.safetensors, byte-tokenizer.json   the latest weights: a built-model folder
    checkpoints/step-00000100/model.safetensors           weights at that step
    checkpoints/step-00000100/optimizer.safetensors       Adam moments, by parameter name
    checkpoints/step-00000100/trainer.json                step, schedule, losses, options
    checkpoints/latest                                    name of the newest complete checkpoint

Each checkpoint folder is written under a temporary name and renamed into place; `latest` is
rewritten (atomically) only afterwards, so a kill at any moment leaves the previous checkpoint
complete and pointed to.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save

from registry.errors import ZooError
from registry.paths import display_path
from runtime.files.atomic import atomic_folder, atomic_write_bytes
from zoo.files.weights import WEIGHTS, load_weights, read_tensors, weights_bytes

CHECKPOINTS = "checkpoints"
LATEST = "latest"
OPTIMIZER = "optimizer.safetensors"
TRAINER = "trainer.json"
KEEP = 2  # checkpoints kept on disk
SHARDS = "shards.json"  # a sharded checkpoint's index (sharded_checkpoints.py)


@dataclass
class Checkpoint:
    folder: Path
    trainer: dict[str, Any]

    @property
    def step(self) -> int:
        return int(self.trainer["step"])


def trainable(model: torch.nn.Module) -> dict[str, torch.nn.Parameter]:
    """The parameters the optimizer holds, by name: all but a frozen base's (--lora)."""
    return {name: p for name, p in model.named_parameters() if p.requires_grad}


def optimizer_tensors(model: torch.nn.Module, optimizer: torch.optim.Optimizer
                      ) -> dict[str, torch.Tensor]:
    """Per-parameter optimizer state keyed `<parameter name>/<state key>`."""
    names = list(trainable(model))
    tensors = {}
    for index, state in optimizer.state_dict()["state"].items():
        for key, value in state.items():
            tensors[f"{names[index]}/{key}"] = torch.as_tensor(value).contiguous()
    return tensors


def save_checkpoint(out: Path, model: torch.nn.Module, optimizer: torch.optim.Optimizer,
                    trainer: dict[str, Any]) -> Path:
    """Write checkpoint `trainer['step']`, point `latest` at it, refresh the top-level weights."""
    root = Path(out) / CHECKPOINTS
    root.mkdir(parents=True, exist_ok=True)
    name = f"step-{trainer['step']:08d}"
    weights = weights_bytes(model, {"format": "pt"})
    groups = [{k: v for k, v in g.items() if k != "params"}
              for g in optimizer.state_dict()["param_groups"]]
    with atomic_folder(root / name, force=True) as staging:
        (staging / WEIGHTS).write_bytes(weights)
        (staging / OPTIMIZER).write_bytes(save(optimizer_tensors(model, optimizer)))
        (staging / TRAINER).write_text(json.dumps({**trainer, "param_groups": groups}, indent=1),
                                       encoding="utf-8")
    atomic_write_bytes(root / LATEST, name.encode())
    atomic_write_bytes(Path(out) / WEIGHTS, weights)
    for old in sorted(p for p in root.glob("step-*") if p.is_dir())[:-KEEP]:
        shutil.rmtree(old, ignore_errors=True)
    return root / name


def latest_checkpoint(out: Path) -> Checkpoint | None:
    pointer = Path(out) / CHECKPOINTS / LATEST
    if not pointer.is_file():
        return None
    folder = pointer.parent / pointer.read_text().strip()
    try:
        trainer = json.loads((folder / TRAINER).read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ZooError(f"{display_path(folder)}: unreadable checkpoint: {exc}") from exc
    return Checkpoint(folder, trainer)


def restore(checkpoint: Checkpoint, model: torch.nn.Module,
            optimizer: torch.optim.Optimizer) -> None:
    """Load weights and optimizer state saved by `save_checkpoint` into fresh objects."""
    load_weights(model, checkpoint.folder / WEIGHTS)
    tensors = read_tensors(checkpoint.folder / OPTIMIZER)
    names = list(trainable(model))
    state: dict[int, dict[str, torch.Tensor]] = {}
    for key, value in tensors.items():
        name, _, field = key.rpartition("/")
        if name not in names:
            raise ZooError(f"{display_path(checkpoint.folder / OPTIMIZER)}: state for unknown "
                           f"parameter {name}")
        state.setdefault(names.index(name), {})[field] = value
    groups = optimizer.state_dict()["param_groups"]
    for group, saved in zip(groups, checkpoint.trainer["param_groups"], strict=True):
        group.update(saved)
    optimizer.load_state_dict({"state": state, "param_groups": groups})
