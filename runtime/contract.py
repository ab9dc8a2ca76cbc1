"""The ONNX contract's shared names (docs/onnx-contract.md): the manifest, and the key/value
cache every generating graph takes and returns. What each family's graphs take and return is
declared by the family (export/families/).

Names follow ONNX Runtime GenAI and Hugging Face Optimum. Integer inputs are int64; batch,
sequence and past length are dynamic axes.

A quantized export stores its client graphs (those under `onnx/`, where transformers.js looks)
under the names transformers.js selects by `dtype` (`quantized_name`), and the manifest's
`quantization.stored_as` records each renamed graph; code names a graph by its contract name
and `stored_files` says which file holds it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

MANIFEST = "manifest.json"
# The encoder's and decoder's one graph, where transformers.js and Optimum look for it.
MODEL_GRAPH = "onnx/model.onnx"
# A dual encoder's towers (CLIP, SigLIP), as transformers.js's CLIPTextModelWithProjection and
# CLIPVisionModelWithProjection and Optimum look for them; MODEL_GRAPH is its joint graph.
TEXT_GRAPH, VISION_GRAPH = "onnx/text_model.onnx", "onnx/vision_model.onnx"
FORMAT_VERSION = 1
LAYOUT = "layout"  # manifest entry: graphs made for clients that look for other files
# The encoder-decoder in Optimum's and transformers.js's layout (export/targets/seq2seq_layout.py)
LAYOUT_ENCODER = "onnx/encoder_model.onnx"
LAYOUT_DECODER = "onnx/decoder_model_merged.onnx"
USE_CACHE_BRANCH = "use_cache_branch"
CLIENT_FOLDER = "onnx/"  # graphs the Hugging Face clients open: quantized ones take dtype names
# `zoo export --quantize` choice -> transformers.js's `dtype` for its files: int8-dynamic is its
# q8 (dynamic quantization with int8 weights, what its converter and Optimum ship as
# model_quantized.onnx); int8 and int4 are MatMulNBits weights: q4 is its 4-bit MatMulNBits,
# and `int8` names the weights' type (its converter's int8 file is MatMulInteger instead).
DTYPES = {"int8-dynamic": "q8", "int8": "int8", "int4": "q4"}
DTYPES["gguf"] = "q4"  # MatMulNBits blocks, as int4's (Q8_0 / K-quant linears at 8 bits)
# transformers.js's DEFAULT_DTYPE_SUFFIX_MAPPING (src/utils/dtypes.js, 4.x), for these dtypes.
DTYPE_SUFFIXES = {"fp32": "", "fp16": "_fp16", "q8": "_quantized", "int8": "_int8", "q4": "_q4",
                  "q4f16": "_q4f16"}
# `zoo export --dtype fp16`: transformers.js's dtype with float16 activations, by its float32
# one (int4's MatMulNBits with float16 scales and activations is its q4f16).
HALF_DTYPES = {"fp32": "fp16", "q4": "q4f16"}
# the manifest entries whose `stored_as` maps contract names to renamed files, in that order
RENAMING_ENTRIES = ("quantization", "precision")
CACHE_INPUT, CACHE_OUTPUT = "past_key_values", "present"


DECODER, ENCODER = ".decoder", ".encoder"  # the encoder-decoder's self and cross caches

# `zoo export --adapters keep`: each adapted linear's LoRA factors are graph inputs, after the
# family's own inputs and before the cache: `{module}.lora_A` (batch, in, rank) and
# `{module}.lora_B` (batch, rank, out), a row's each, the scale folded into B; zeros are the
# base. The manifest's ADAPTERS entry lists them and the adapter files (ONNX Runtime's format).
ADAPTERS = "adapters"
ADAPTER_FOLDER = "adapters"
ADAPTER_SUFFIX = ".onnx_adapter"  # onnxruntime.AdapterFormat's files (GenAI's extension)
ADAPTER_RANK = "adapter_rank"  # the factors' dynamic rank axis (their batch: `batch_size`)


def lora_inputs(module: str) -> tuple[str, str]:
    """The graph inputs of one adapted linear (the zoo's module name): A, then B."""
    return f"{module}.lora_A", f"{module}.lora_B"


def adapter_file(name: str) -> str:
    """Where an export keeps the adapter `name`: adapters/NAME.onnx_adapter."""
    return f"{ADAPTER_FOLDER}/{name}{ADAPTER_SUFFIX}"


def past_names(n_layers: int, prefix: str, *infixes: str) -> list[str]:
    """`past_key_values.{i}.key`, ... or with infix `.decoder` (`.encoder`) for the
    encoder-decoder; several infixes interleave per layer, as Optimum orders them:
    `{i}.decoder.key`, `{i}.decoder.value`, `{i}.encoder.key`, `{i}.encoder.value`."""
    return [f"{prefix}.{i}{infix}.{kind}" for i in range(n_layers) for infix in infixes or ("",)
            for kind in ("key", "value")]


def client_dtype_of(quantize: str | None, dtype: str = "fp32") -> str:
    """transformers.js's dtype for an export made with `--quantize quantize --dtype dtype`."""
    base = DTYPES[quantize] if quantize else "fp32"
    return HALF_DTYPES[base] if dtype == "fp16" else base


def quantized_name(file: str, choice: str | None, dtype: str = "fp32") -> str:
    """Where `--quantize choice [--dtype fp16]` stores the client graph `file`:
    `onnx/model.onnx` becomes `onnx/model_q4.onnx` for int4 (`model_q4f16.onnx` with fp16,
    `model_fp16.onnx` for fp16 alone), the file transformers.js opens with that `dtype`."""
    suffix = DTYPE_SUFFIXES[client_dtype_of(choice, dtype)]
    return f"{file.removesuffix('.onnx')}{suffix}.onnx"


def client_dtype(file: str, stored: str) -> str:
    """transformers.js's dtype that opens the client graph `file` where it is `stored`."""
    stem = file.removesuffix(".onnx")
    return next(dtype for dtype, suffix in DTYPE_SUFFIXES.items()
                if stored == f"{stem}{suffix}.onnx")


def stored_files(manifest: Mapping[str, Any]) -> dict[str, str]:
    """{contract name: the file that holds it} for each graph the manifest lists: the name
    itself, or for a quantized client graph its dtype name (`quantization.stored_as`)."""
    contract_name = {file: name for name, file in renamed_graphs(manifest).items()}
    return {contract_name.get(file, file): file for file in manifest.get("graphs", {})}


def renamed_graphs(manifest: Mapping[str, Any]) -> dict[str, str]:
    """{contract name: stored name} of the graphs a quantized or float16 export renamed: its
    `quantization.stored_as`, or a float16 export's `precision.stored_as`."""
    for entry in RENAMING_ENTRIES:
        record = manifest.get(entry)
        stored_as = record.get("stored_as") if isinstance(record, dict) else None
        if stored_as:
            return dict(stored_as)
    return {}
