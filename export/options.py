"""ExportOptions: everything `zoo export` is asked for, in one object that the command line, the
public API, the pipeline, the writer, the variants and the manifest all read (as BenchOptions
and TrainOptions do for their commands), checked once before any work."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from export.checks.parity import DEFAULT_ATOL, DEFAULT_RTOL
from export.onnx.quantize import DYNAMIC, check_choice
from export.onnx.trace import DEFAULT_OPSET, check_opset
from registry.errors import ZooError
from runtime.files.texts import TextRow, read_texts
from runtime.sessions import require_provider


@dataclass(frozen=True)
class ExportOptions:
    opset: int = DEFAULT_OPSET
    provider: str = "cpu"  # where the parity check runs the export
    atol: float = DEFAULT_ATOL
    rtol: float = DEFAULT_RTOL
    force: bool = False  # replace an existing OUT
    optimize: bool = False  # ONNX Runtime's fusions (decoders: also model_kv.onnx)
    quantize: str | None = None  # "int8" | "int4": weight-only MatMulNBits; "int8-dynamic"
    attentions: bool = False  # the graphs also output every layer's attention maps
    calibration: Path | None = None  # int8-dynamic's smoothing reads these texts (a data file)

    @property
    def plain(self) -> bool:
        """Neither optimized nor quantized: the parity grid's report alone is the result."""
        return not self.optimize and not self.quantize

    def check(self) -> None:
        """Refuse what cannot be done before minutes of exporting (a CUDA provider that
        would not really run, an opset torch.onnx cannot write, an unknown quantization)."""
        check_opset(self.opset)
        require_provider(self.provider)
        if self.quantize:
            check_choice(self.quantize)
        # the file itself is read (and refused) by export_and_verify, before the trace
        if self.calibration is not None and self.quantize != DYNAMIC:
            raise ZooError(f"--calibration: only --quantize {DYNAMIC} calibrates (it "
                           "measures activations); drop it or add that")

    def calibration_rows(self) -> list[TextRow] | None:
        """--calibration's texts (one a line, or .jsonl / .csv with a 'text' column), or None:
        the shipped text."""
        return None if self.calibration is None else read_texts(self.calibration)
