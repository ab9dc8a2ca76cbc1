"""ExportOptions: everything `zoo export` is asked for, in one object that the command line, the
public API, the pipeline, the writer, the variants and the manifest all read (as BenchOptions
and TrainOptions do for their commands), checked once before any work."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from export.checks.parity import DEFAULT_ATOL, DEFAULT_RTOL
from export.onnx.precision import DTYPES, FP16, FP32, HALF_QUANTIZE, PrecisionError, check_dtype
from export.onnx.quantize import CHOICES, DYNAMIC, check_choice
from export.onnx.trace import DEFAULT_OPSET, check_opset
from registry.errors import ZooError
from registry.options import option
from runtime.files.texts import TextRow, read_texts
from runtime.sessions import PROVIDERS, require_provider

MERGE, KEEP = "merge", "keep"  # --adapters


@dataclass(frozen=True)
class ExportOptions:
    opset: int = option(DEFAULT_OPSET, "ONNX opset (18 to 25).")
    provider: str = option("cpu", "ONNX Runtime provider for the parity check.",
                           choices=PROVIDERS)
    atol: float = option(DEFAULT_ATOL, "Parity absolute tolerance.")
    rtol: float = option(DEFAULT_RTOL, "Parity relative tolerance.")
    force: bool = option(False, "Overwrite an existing output folder.")
    optimize: bool = option(
        False, "ONNX Runtime's transformer fusions; decoders also get model_kv.onnx, a "
        "generation graph whose key/value cache is updated in place.")
    quantize: str | None = option(
        None, "int8/int4: weight-only MatMul quantization, checked by top-1 agreement with "
        "fp32; int8-dynamic (encoders, embedders, classifiers): int8 weights and activations, "
        "checked by a quality gate (sentence cosine, label agreement, MLM top-1) instead of "
        "the parity grid.", choices=CHOICES)
    dtype: str = option(
        "fp32", "fp16: weights, activations and the decoders' cache in float16 (positions, "
        "masks, softmax and RMS norms kept float32, as transformers computes them), stored as "
        "onnx/model_fp16.onnx; with --quantize int4, 4-bit weights and float16 activations "
        "(onnx/model_q4f16.onnx). Checked against PyTorch run in float16.", choices=DTYPES)
    attentions: bool = option(
        False, "Also output every layer's attention maps (attentions.{i}, Hugging Face's "
        "names); checked by the parity grid like every output.")
    calibration: Path | None = option(
        None, "int8-dynamic: measure the activations to smooth on these texts (one a line, or "
        ".jsonl / .csv with a 'text' column; 64 rows spread over the file) instead of the "
        "shipped English text: text like the model's own use.", path="file", metavar="FILE")
    adapters: str = option(
        MERGE, "A folder with a LoRA adapter (zoo train --lora, zoo import --adapter): merge "
        "it into the weights, or keep it apart: the base exported once with each adapted "
        "linear's LoRA factors as graph inputs (zeros: the base) and the adapter as an ONNX "
        "Runtime adapter file (adapters/NAME.onnx_adapter), chosen at run time (zoo run "
        "--adapter NAME) or per request (zoo serve --adapter).", choices=(MERGE, KEEP))

    @property
    def plain(self) -> bool:
        """Neither optimized nor quantized: the parity grid's report alone is the result."""
        return not self.optimize and not self.quantize and self.dtype == FP32

    def check(self) -> None:
        """Refuse what cannot be done before minutes of exporting (a CUDA provider that
        would not really run, an opset torch.onnx cannot write, an unknown quantization)."""
        check_opset(self.opset)
        require_provider(self.provider)
        if self.quantize:
            check_choice(self.quantize)
        check_dtype(self.dtype, self.provider)
        if self.dtype == FP16 and self.quantize not in (None, *HALF_QUANTIZE):
            raise PrecisionError(f"--dtype fp16 --quantize {self.quantize}: float16 "
                                 f"activations go with --quantize {', '.join(HALF_QUANTIZE)} "
                                 "(q4f16) or no quantization (fp16)")
        if self.adapters == KEEP and not self.plain:
            asked = "--optimize" if self.optimize else (
                f"--quantize {self.quantize}" if self.quantize else f"--dtype {self.dtype}")
            raise ZooError(f"--adapters keep: not with {asked} (the fused, quantized and "
                           "float16 graphs do not take the adapter inputs); use --adapters "
                           "merge")
        # the file itself is read (and refused) by export_and_verify, before the trace
        if self.calibration is not None and self.quantize != DYNAMIC:
            raise ZooError(f"--calibration: only --quantize {DYNAMIC} calibrates (it "
                           "measures activations); drop it or add that")

    def calibration_rows(self) -> list[TextRow] | None:
        """--calibration's texts (one a line, or .jsonl / .csv with a 'text' column), or None:
        the shipped text."""
        return None if self.calibration is None else read_texts(self.calibration)
