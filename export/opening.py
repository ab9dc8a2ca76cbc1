"""Where an export or a model is opened, and its family resolved, once: the family table
(export/families) is looked up here, where a command starts (and in the command modules), and
everything below takes the family from the engine it is handed (`engine.family`). Running
alone opens through runtime/opening.py, which needs no family object."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import onnxruntime as ort
from torch import nn

from export.families import family_of
from export.torch_engine import TorchEngine
from registry.catalog import Card
from runtime.manifest import manifest_card, read_manifest
from runtime.sessions import Runtime


def open_export(folder: Path, provider: str = "cpu", threads: int | None = None,
                verify: bool = True) -> Runtime:
    """An export folder in ONNX Runtime, after checking every file's sha256 (unless `verify`
    is False)."""
    return open_staged(Path(folder), read_manifest(Path(folder), verify_files=verify),
                       provider, threads)


def open_staged(folder: Path, manifest: dict[str, Any], provider: str = "cpu",
                threads: int | None = None, options: ort.SessionOptions | None = None
                ) -> Runtime:
    """Files with the manifest that is about to be written beside them (zoo export's check
    of its staged folder); `options` for every session, where given."""
    card = manifest_card(folder, manifest)
    return Runtime(folder, manifest, card, provider, threads, family_of(card), options)


def open_model(model: nn.Module, card: Card, device: str = "cpu",
               attentions: bool = False) -> TorchEngine:
    """A PyTorch model behind the engine interface parity and generation drive."""
    return TorchEngine(model, card, family_of(card), device, attentions)
