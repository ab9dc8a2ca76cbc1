"""manifest.json written: what an export holds (card, versions, opset, IR version, each file's
sha256). Reading it back, and the check that nothing was changed since, is runtime/manifest.py."""

from __future__ import annotations

import json
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

import onnx

from registry.catalog import Card
from registry.sizes import cache_entry
from runtime.contract import CACHE_INPUT, FORMAT_VERSION, MANIFEST
from runtime.files.atomic import sha256

PACKAGES = ("zoo", "torch", "onnx", "onnxscript", "onnxruntime", "onnxruntime-gpu", "numpy",
            "safetensors")


def package_versions() -> dict[str, str]:
    found = {}
    for name in PACKAGES:
        try:
            found[name] = version(name)
        except PackageNotFoundError:
            continue
    return found


def build_manifest(folder: Path, card: Card, opset: int, versions: dict[str, str],
                   contract: dict[str, tuple[list[str], list[str]]],
                   entries: dict[str, Any]) -> dict[str, Any]:
    """What manifest.json will say of the files now in `folder`. `contract`: {graph file:
    (input names, output names)}, in the graphs' own order; `entries`: what a variant adds
    (optimization, generation, quantization, attentions)."""
    files = sorted(p.relative_to(folder).as_posix() for p in folder.rglob("*")
                   if p.is_file() and p.name != MANIFEST)
    return {
        "format_version": FORMAT_VERSION,
        "name": card.name,
        "family": card.family,
        "card": card.fields,
        "opset": opset,
        "ir_version": onnx.load(str(folder / next(iter(contract))),
                                load_external_data=False).ir_version,
        "versions": versions,
        "graphs": {name: {"inputs": inputs, "outputs": outputs}
                   for name, (inputs, outputs) in contract.items()},
        **({"cache": cache_entry(card)} if _has_cache(contract) else {}),
        "files": {name: {"sha256": sha256(folder / name), "bytes": (folder / name).stat().st_size}
                  for name in files},
        **entries,
    }


def write_manifest(folder: Path, manifest: dict[str, Any]) -> None:
    """Written once, last: nothing is added to it afterwards."""
    (folder / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n", encoding="utf-8")


def _has_cache(contract: dict[str, tuple[list[str], list[str]]]) -> bool:
    return any(name.startswith(f"{CACHE_INPUT}.") for inputs, _ in contract.values()
               for name in inputs)
