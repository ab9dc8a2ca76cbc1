"""The refusals a user relies on, each provoked for real: an ONNX graph that computes something
else than PyTorch, and a quantization that lost the model, both stop `zoo export` with exit 2
and leave nothing behind."""

from __future__ import annotations

from pathlib import Path

import onnx
import pytest
import torch
from onnx import numpy_helper
from torch import nn

import export.onnx.variants
from tests.conftest import SharedExport, on_shared, traces_reused
from tests.support.helpers import assert_refused_and_nothing_written
from zoo.blocks.norms import LayerNorm


@pytest.mark.parametrize("name", ["gpt-tiny"])  # the grid is the same code for every family
def test_an_export_that_computes_something_else_fails_parity(
        name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A norm that behaves differently while being exported (as a block with an export-only
    branch would): the graph drifts by 0.01 from what PyTorch computes."""

    def drifts_when_exported(self: LayerNorm, x: torch.Tensor) -> torch.Tensor:
        y = nn.LayerNorm.forward(self, x)
        return y + 0.01 if torch.compiler.is_exporting() else y

    monkeypatch.setattr(LayerNorm, "forward", drifts_when_exported)
    assert_refused_and_nothing_written(["export", name, "--onnx"], tmp_path / "out",
                                       "parity failed")


@on_shared("gpt-tiny")
def test_a_quantization_that_lost_the_model_is_refused_by_the_gate(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, shared_export: SharedExport,
        shared_traces: dict) -> None:
    """The quantizer's output with every block scale negated: still MatMulNBits, still runs,
    but the logits are nonsense; the agreement gate must catch it. The fp32 graph is the
    shared gpt-tiny export's trace (the same seed; only the quantizer is patched)."""
    shared_export("gpt-tiny")
    real_quantize = export.onnx.variants.quantize

    def broken_quantize(model: onnx.ModelProto, choice: str, level: int
                        ) -> tuple[onnx.ModelProto, int]:
        quantized, count = real_quantize(model, choice, level)
        scales = {node.input[2] for node in quantized.graph.node if node.op_type == "MatMulNBits"}
        for tensor in quantized.graph.initializer:
            if tensor.name in scales:
                tensor.CopyFrom(numpy_helper.from_array(-numpy_helper.to_array(tensor),
                                                        tensor.name))
        return quantized, count

    monkeypatch.setattr(export.onnx.variants, "quantize", broken_quantize)
    # (tests/export/test_bench.py exports the same card unbroken: it passes the gate)
    with traces_reused(shared_traces):
        assert_refused_and_nothing_written(
            ["export", "gpt-tiny", "--onnx", "--seed", "1", "--quantize", "int8"],
            tmp_path / "out", "quantized export disagrees with fp32")

