"""Where an export is opened to run it: the manifest read and checked, the card validated again,
the graphs loaded in ONNX Runtime (export/opening.py opens the same for the exporter's checks,
with the family's object)."""

from __future__ import annotations

from pathlib import Path

from runtime.manifest import manifest_card, read_manifest
from runtime.sessions import Runtime


def open_export(folder: Path, provider: str = "cpu", threads: int | None = None,
                verify: bool = True) -> Runtime:
    """An export folder in ONNX Runtime, after checking every file's sha256 (unless `verify`
    is False)."""
    folder = Path(folder)
    manifest = read_manifest(folder, verify_files=verify)
    return Runtime(folder, manifest, manifest_card(folder, manifest), provider, threads)
