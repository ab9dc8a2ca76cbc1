"""The same random weights for every engine: Hugging Face models built from their configs
(seeded), saved as safetensors, imported by the zoo and exported by both exporters.

Run inside benchmarks/.venv (benchmarks/setup.sh): Optimum needs transformers < 4.58.
Everything lands under one work folder; an engine's files are made once and reused.
"""

from __future__ import annotations

import contextlib
import io
import logging
import warnings
from pathlib import Path

import torch

SEED = 0
MODELS = {"bert-base": "fill-mask", "gpt2-small": "text-generation-with-past"}


def hf_folder(name: str, work: Path) -> Path:
    """bert-base-uncased's or gpt2's shape, random weights from SEED, as a local HF folder."""
    from transformers import BertConfig, BertForMaskedLM, GPT2Config, GPT2LMHeadModel

    folder = work / f"hf-{name}"
    if (folder / "model.safetensors").exists():
        return folder
    torch.manual_seed(SEED)
    if name == "bert-base":
        model = BertForMaskedLM(BertConfig())  # bert-base-uncased: 12 x 768, vocab 30522
    else:
        model = GPT2LMHeadModel(GPT2Config())  # gpt2: 12 x 768, vocab 50257
    model.eval().save_pretrained(folder, safe_serialization=True)
    return folder


def zoo_export(name: str, work: Path, optimize: bool, quantize: str | None = None) -> Path:
    """`zoo import` of the HF folder, then `zoo export` (parity-checked against PyTorch; a
    quantized one through its agreement check or quality gate)."""
    from export.options import ExportOptions
    from export.pipeline import export_and_verify
    from zoo.files.importers import import_checkpoint
    from zoo.files.sources import load_source

    built = work / f"zoo-{name}"
    if not (built / "model.safetensors").exists():
        import_checkpoint(hf_folder(name, work), built, force=True)
    kind = "optimize" if optimize else "default"
    out = work / f"zoo-{name}-{kind}{f'-{quantize}' if quantize else ''}"
    if not (out / "manifest.json").exists():
        model, card = load_source(str(built), (), SEED, None)
        export_and_verify(model, card, out, ExportOptions(force=True, optimize=optimize,
                                                          quantize=quantize),
                          source_folder=built)
    return out


def optimum_export(name: str, work: Path) -> Path:
    """Optimum's exporter with its defaults, as a new user runs `optimum-cli export onnx`."""
    from optimum.exporters.onnx import main_export

    out = work / f"optimum-{name}"
    if not (out / "model.onnx").exists():
        with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
            warnings.simplefilter("ignore")
            logging.disable(logging.WARNING)
            main_export(str(hf_folder(name, work)), out, task=MODELS[name])
            logging.disable(logging.NOTSET)
    return out


def optimum_quantized(name: str, work: Path, vnni: bool) -> Path:
    """Optimum's ORTQuantizer on its own export: dynamic int8 with the configuration for this
    CPU (AVX-512 VNNI, else AVX2), per-channel, as its documentation shows."""
    from optimum.onnxruntime import ORTQuantizer
    from optimum.onnxruntime.configuration import AutoQuantizationConfig

    out = work / f"optimum-{name}-int8"
    if not (out / "model_quantized.onnx").exists():
        config = (AutoQuantizationConfig.avx512_vnni if vnni else AutoQuantizationConfig.avx2)(
            is_static=False, per_channel=True)
        with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
            warnings.simplefilter("ignore")
            quantizer = ORTQuantizer.from_pretrained(optimum_export(name, work))
            quantizer.quantize(config, out)
    return out
