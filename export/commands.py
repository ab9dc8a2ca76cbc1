"""`zoo export`, `zoo parity` and `zoo triton`: an export made and proved, an export proved
again, and a Triton model repository made from one."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from export.api import export_model
from export.checks.verify import verify
from export.opening import open_export
from export.options import ExportOptions
from export.targets.triton import TritonOptions, write_repository
from runtime.files.atomic import check_writable, refuse_existing, wrote
from zoo.files.weights import load_built

Progress = Callable[[str], None]


def export_command(source: str, out: Path, options: ExportOptions, seed: int = 0,
                   overrides: dict[str, Any] | None = None, registries: Sequence[str] = (),
                   triton: Path | None = None, progress: Progress = lambda message: None
                   ) -> list[str]:
    """The check's table and what was written; with `triton`, the repository too. A failed
    check raises ParityError or AgreementError, each carrying the report to print."""
    if triton is not None:  # before the export lands: a repository that cannot be written
        refuse_existing(triton, options.force)
        check_writable(triton)
    report = export_model(source, out, options, seed, overrides, registries, progress)
    lines = [report.table(), wrote(out)]
    if triton is not None:
        kind = "gpu" if options.provider == "cuda" else "cpu"
        lines += triton_command(out, triton, TritonOptions(kind=kind), options.force)
    return lines


def triton_command(export: Path, repository: Path, options: TritonOptions,
                   force: bool = False) -> list[str]:
    written = write_repository(export, repository, options, force)
    lines = [f"wrote {folder}/ (Triton model {name}: config.pbtxt, 1/model.onnx)"
             for name, folder in written.items()]
    return lines + [f"serve: tritonserver --model-repository={repository.resolve()}"]


def parity_command(folder: Path, provider: str, atol: float, rtol: float) -> list[str]:
    """The parity grid (a quantized export: the agreement check) run again on `folder`."""
    runtime = open_export(folder, provider)  # verifies the manifest's sha256 first
    model, card = load_built(folder)
    return [verify(model, card, runtime, atol, rtol).table()]
