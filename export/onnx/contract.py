"""The ONNX contract's shared names (docs/onnx-contract.md): the manifest, and the key/value
cache every generating graph takes and returns. What each family's graphs take and return is
declared by the family (export/families/).

Names follow ONNX Runtime GenAI and Hugging Face Optimum. Integer inputs are int64; batch,
sequence and past length are dynamic axes.
"""

from __future__ import annotations

MANIFEST = "manifest.json"
# The encoder's and decoder's one graph, where transformers.js and Optimum look for it.
MODEL_GRAPH = "onnx/model.onnx"
FORMAT_VERSION = 1
LAYOUT = "layout"  # manifest entry: graphs made for clients that look for other files
# The encoder-decoder in Optimum's and transformers.js's layout (serving/seq2seq_layout.py)
LAYOUT_ENCODER = "onnx/encoder_model.onnx"
LAYOUT_DECODER = "onnx/decoder_model_merged.onnx"
USE_CACHE_BRANCH = "use_cache_branch"
CACHE_INPUT, CACHE_OUTPUT = "past_key_values", "present"


DECODER, ENCODER = ".decoder", ".encoder"  # the encoder-decoder's self and cross caches


def past_names(n_layers: int, prefix: str, *infixes: str) -> list[str]:
    """`past_key_values.{i}.key`, ... or with infix `.decoder` (`.encoder`) for the
    encoder-decoder; several infixes interleave per layer, as Optimum orders them:
    `{i}.decoder.key`, `{i}.decoder.value`, `{i}.encoder.key`, `{i}.encoder.value`."""
    return [f"{prefix}.{i}{infix}.{kind}" for i in range(n_layers) for infix in infixes or ("",)
            for kind in ("key", "value")]
