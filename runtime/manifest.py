"""manifest.json read back: what an export holds, after checking that every file it names stays
in the folder and that nothing was changed since (each file's sha256). Written by
export/onnx/manifest.py."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from registry.catalog import Card
from registry.errors import ZooError
from registry.paths import display_path, inside
from registry.schema import validate
from runtime.contract import FORMAT_VERSION, LAYOUT, MANIFEST
from runtime.files.atomic import sha256


class ManifestError(ZooError):
    """A folder that is not an export, or whose files changed after export."""


def read_manifest(folder: Path, verify_files: bool = True) -> dict[str, Any]:
    """The manifest of an export folder, after checking every file's sha256."""
    folder = Path(folder)
    where = display_path(folder)
    if not folder.is_dir():
        raise ManifestError(f"{where}: no such folder")
    path = inside(folder, MANIFEST, where, "manifest")
    if not path.is_file():
        raise ManifestError(f"{where}: not an export (no {MANIFEST}); make one with zoo export")
    try:
        manifest = json.loads(path.read_text(encoding="utf-8"))
    except (ValueError, UnicodeDecodeError, RecursionError) as exc:
        raise ManifestError(f"{display_path(path)}: not valid JSON: {exc}") from exc
    if not isinstance(manifest, dict) or not isinstance(manifest.get("files"), dict):
        raise ManifestError(f"{display_path(path)}: field 'files' missing")
    found = manifest.get("format_version")
    if found != FORMAT_VERSION:
        raise ManifestError(f"{display_path(path)}: format_version={found!r}, this zoo reads "
                            f"{FORMAT_VERSION}")
    _check_names_inside(folder, manifest, display_path(path))
    if verify_files:
        for name, entry in manifest["files"].items():
            file = folder / name
            if not file.is_file():
                raise ManifestError(f"{display_path(file)}: listed in {MANIFEST} but missing")
            if sha256(file) != entry.get("sha256"):
                raise ManifestError(f"{display_path(file)}: sha256 does not match {MANIFEST} "
                                    "(changed after export)")
    return manifest


def manifest_card(folder: Path, manifest: dict[str, Any]) -> Card:
    """The card an export was made from, validated again (a manifest is a file anyone may
    have edited)."""
    return Card(manifest.get("name", "?"), Path(folder) / MANIFEST,
                validate(manifest["card"], display_path(folder)))


def _check_names_inside(folder: Path, manifest: dict[str, Any], where: str) -> None:
    """Every file the manifest names stays in the export folder (checked before any is read)."""
    graphs = manifest.get("graphs", {})
    if not isinstance(graphs, dict):
        raise ManifestError(f"{where}: field 'graphs' should map file names to their names")
    generation = manifest.get("generation")
    if generation is not None and not (isinstance(generation, dict)
                                       and isinstance(generation.get("file"), str)):
        raise ManifestError(f"{where}: field 'generation' should hold the 'file' it names")
    if not all(isinstance(entry, dict) for entry in manifest["files"].values()):
        raise ManifestError(f"{where}: field 'files' should map each file name to its entry")
    if not isinstance(manifest.get("card"), dict):
        raise ManifestError(f"{where}: field 'card' should hold the card the export was made from")
    layout = manifest.get(LAYOUT, {"graphs": {}})
    layout_graphs = layout.get("graphs") if isinstance(layout, dict) else None
    if not isinstance(layout_graphs, dict) or not all(isinstance(name, str)
                                                      for name in layout_graphs):
        raise ManifestError(f"{where}: field '{LAYOUT}' should hold 'graphs', mapping file "
                            "names to their names")
    _check_stored_as(manifest.get("quantization"), {**graphs, **layout_graphs}, where)
    named = [("files", name) for name in manifest["files"]]
    named += [("graphs", name) for name in graphs]
    named += [(f"{LAYOUT}.graphs", name) for name in layout_graphs]
    if generation is not None:
        named.append(("generation.file", generation["file"]))
    for field, name in named:
        inside(folder, name, where, field)


def _check_stored_as(quantization: Any, graphs: dict[str, Any], where: str) -> None:
    """A quantized export's `stored_as` names only graphs the manifest lists (by name only:
    the files it may open are `graphs`' own)."""
    stored_as = quantization.get("stored_as", {}) if isinstance(quantization, dict) else {}
    if not isinstance(stored_as, dict) or not all(
            isinstance(name, str) and isinstance(file, str) and file in graphs
            for name, file in stored_as.items()):
        raise ManifestError(f"{where}: field 'quantization.stored_as' should map contract "
                            "graph names to graphs listed in 'graphs' (or 'layout.graphs')")
