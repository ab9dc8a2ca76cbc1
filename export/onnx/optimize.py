"""ONNX Runtime's transformer fusions (onnxruntime.transformers.optimizer) on exported graphs,
with the fused-operator counts and a plain message for every expected fusion that did not fire.

The pattern matchers were written for graphs from the TorchScript exporter and Hugging Face
models; ours come from torch.onnx's dynamo exporter, so some fusions do not match (attention,
above all). That is reported, not hidden. EmbedLayerNormalization is switched off on purpose:
it numbers positions 0..S-1 itself, while our position ids count real tokens only, so padded
rows would change. Gelu is kept exact (no tanh approximation of an erf GELU).
SkipLayerNormalization is switched off too, measured: its CPU kernel was eight times slower
than the LayerNormalization + Add it replaces (see runtime/sessions.py).
"""

from __future__ import annotations

import contextlib
import io
import logging
from collections import Counter
from dataclasses import dataclass, field

import onnx

from export.logs import quiet_loggers
from export.onnx.shared_cache import KV_FILE
from registry.blocks import GEGLU, GELU, GELU_TANH
from registry.catalog import Card
from registry.sizes import attention_sizes

MS_DOMAIN = "com.microsoft"
ACTIVATION_FUSIONS = {GELU: ("BiasGelu", "Gelu"), GELU_TANH: ("FastGelu",),
                      GEGLU: ("Gelu", "BiasGelu")}  # GeGLU: the gate, without a bias


@dataclass
class FusionReport:
    counts: dict[str, dict[str, int]] = field(default_factory=dict)  # file -> {op: count}
    missing: list[str] = field(default_factory=list)  # one message per expected fusion missing

    def lines(self) -> list[str]:
        lines = []
        for file, counts in self.counts.items():
            shown = ", ".join(f"{op} x{n}" for op, n in sorted(counts.items())) or "none"
            lines.append(f"fused operators in {file}: {shown}")
        return lines + [f"note: {message}" for message in self.missing]

    def as_dict(self) -> dict:
        return {"fused": self.counts, "not_fused": self.missing}


def _ms_ops(model: onnx.ModelProto) -> Counter:
    return Counter(node.op_type for node in model.graph.node if node.domain == MS_DOMAIN)


def ensure_ms_opset(model: onnx.ModelProto) -> None:
    """Fused nodes live in com.microsoft; the optimizer does not always declare the domain."""
    uses = any(node.domain == MS_DOMAIN for node in model.graph.node)
    if uses and not any(entry.domain == MS_DOMAIN for entry in model.opset_import):
        model.opset_import.append(onnx.helper.make_opsetid(MS_DOMAIN, 1))


def expected_fusions(card: Card, file: str) -> list[tuple[str, ...]]:
    """Each entry is satisfied by any one of its op types."""
    expected: list[tuple[str, ...]] = []
    if card["activation"] in ACTIVATION_FUSIONS:
        expected.append(ACTIVATION_FUSIONS[card["activation"]])
    if file != KV_FILE:  # that graph has GroupQueryAttention from the exporter
        expected.append(("Attention", "MultiHeadAttention"))
    return expected


def fuse(model: onnx.ModelProto, card: Card, file: str, report: FusionReport,
         model_type: str, attention_note: str = "") -> onnx.ModelProto:
    """The fused model; the counts of fused operators it gained go into `report`.
    `model_type`: the optimizer's pattern set (the family's); `attention_note`: why a missing
    attention fusion does not matter, where it does not."""
    from onnxruntime.transformers.fusion_options import FusionOptions
    from onnxruntime.transformers.optimizer import optimize_model

    options = FusionOptions(model_type)
    options.enable_embed_layer_norm = False
    options.enable_gelu_approximation = False
    options.enable_skip_layer_norm = False
    options.enable_bias_skip_layer_norm = False
    # LayerNorm already arrives as LayerNormalization; the fusion would only turn RMSNorm into
    # SimplifiedLayerNormalization, an ORT-internal op in the ONNX domain that onnx.checker
    # rejects. ORT fuses it in memory when it loads the graph anyway.
    options.enable_layer_norm = False
    before = _ms_ops(model)
    # ORT's optimizer also prints (a failed symbolic shape inference on BERT-style graphs, which
    # it recovers from): kept off our stdout, which carries the command's own lines.
    with quiet_loggers("onnxruntime", "onnxruntime.transformers", "fusion_base", "onnx_model",
                       disable=logging.WARNING), contextlib.redirect_stdout(io.StringIO()):
        optimized = optimize_model(model, model_type=model_type,
                                   num_heads=attention_sizes(card).heads,
                                   hidden_size=card["d_model"], opt_level=0,
                                   optimization_options=options)
    fused = optimized.model
    ensure_ms_opset(fused)
    gained = _ms_ops(fused) - before
    report.counts[file] = dict(gained)
    for choices in expected_fusions(card, file):
        if not any(gained.get(op) for op in choices):
            why = "ORT's pattern matcher did not recognise the subgraph torch.onnx (dynamo) emitted"
            if choices[0] == "Attention" and attention_note:
                why += f"; {attention_note}"
            report.missing.append(f"{file}: expected fusion {' or '.join(choices)} did not "
                                  f"happen ({why})")
    return fused
