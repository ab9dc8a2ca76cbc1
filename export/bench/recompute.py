"""The decoder graph as it was before the cross-attention cache (issue #12): it takes the
encoder's `last_hidden_state` and re-projects it to every layer's cross keys/values at each
step. Built here only so `zoo bench` measures before and after in one run, on the same weights.
"""

from __future__ import annotations

from pathlib import Path

import onnx
from torch import nn

from export.family import GraphIO, Input
from export.onnx.optimize import FusionReport, fuse
from export.onnx.trace import DEFAULT_OPSET, export_graph, trace_inputs
from export.onnx.wrappers import Outputs, Wrapper, flatten, pair_up
from registry.catalog import Card
from runtime.contract import DECODER
from runtime.sessions import Graph
from zoo.blocks.heads import LMHead

SOURCE = ("batch_size", "encoder_sequence_length")
FILE = "decoder_recompute.onnx"


class RecomputingDecoderGraph(Wrapper):
    def forward(self, input_ids, encoder_hidden_states, encoder_attention_mask, past):  # noqa: ANN001
        def compute() -> Outputs:
            cross = self.model.cross_cache(encoder_hidden_states)  # inside the step
            logits, presents = self.model.decode(input_ids, cross, encoder_attention_mask,
                                                 pair_up(past))
            return (logits, *flatten(presents))

        return self.outputs(compute)


def recomputing_graph(model: nn.Module, card: Card, folder: Path, optimize: bool,
                      provider: str, threads: int | None) -> Graph:
    """The old decoder.onnx (fused as `--optimize` fuses, if asked), in a session."""
    io = GraphIO((Input("input_ids", ("batch_size", "sequence_length"), "ids"),
                  Input("encoder_hidden_states", (*SOURCE, "d_model"), "normal"),
                  Input("encoder_attention_mask", SOURCE, "ones")),
                 (LMHead.graph_output,), RecomputingDecoderGraph, cache_infix=DECODER)
    args, shapes = trace_inputs(io, card)
    names = (io.input_names(card), io.output_names(card))
    proto = export_graph(io.wrapper(model.eval()), args, shapes, names, DEFAULT_OPSET,
                         folder / FILE)
    if optimize:
        proto = fuse(proto, card, FILE, FusionReport(), "bert")
    onnx.save(proto, str(folder / FILE))
    return Graph(folder / FILE, provider, threads)
