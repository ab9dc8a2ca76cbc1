"""The zoo's Python API under its old path: `import zoo` is the public one (zoo/__init__.py);
this module stays, as an alias of its names, for one release.

    from export.api import ExportOptions, GenerateOptions, export_model, load
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from export.checks.agreement import AgreementReport
from export.checks.parity import Report
from export.checks.quality import GateReport
from export.onnx.kept_adapters import check_keep
from export.options import KEEP, ExportOptions
from export.pipeline import VariantReport, export_and_verify
from registry.errors import ZooError
from runtime.exported import Exported, Generated, GenerateOptions, Prompt, load
from runtime.files.atomic import refuse_existing
from zoo.files.sources import load_source

__all__ = ["ExportOptions", "Exported", "GenerateOptions", "Generated", "Prompt", "ZooError",
           "export_model", "load"]


def export_model(source: str | Path, out: str | Path, options: ExportOptions | None = None,
                 seed: int = 0, overrides: dict[str, Any] | None = None,
                 registries: Sequence[str] = (),
                 progress: Callable[[str], None] = lambda message: None
                 ) -> Report | AgreementReport | GateReport | VariantReport:
    """`zoo export`: a card name (built with `seed` and `overrides`) or a model folder to a
    checked export in `out`; returns the check's report (it raised if the check failed).
    The options are checked once, by the pipeline, before anything is traced."""
    options = options or ExportOptions()
    options.check()  # before the model is built or loaded
    refuse_existing(Path(out), options.force)
    progress(f"loading {source}...")
    model, card = load_source(str(source), tuple(registries), seed, overrides,
                              merge=options.adapters != KEEP)
    if options.adapters == KEEP:
        check_keep(model, card, str(source))
    folder = Path(source) if Path(source).is_dir() else None
    return export_and_verify(model, card, Path(out), options, progress, folder)
