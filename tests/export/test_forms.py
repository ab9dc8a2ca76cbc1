"""Graphs fast by construction (issue #14): what a plain ONNX Runtime session makes of an
export, and the PyTorch forms behind it, each against a reference written independently.

The session's own optimized graph (SessionOptions.optimized_model_filepath, default options
otherwise) is read back: that is what an embedder runs. Speed itself is benchmarked, not
tested (benchmarks/peers.py, BENCHMARKS.md)."""

from __future__ import annotations

import math
from collections import Counter
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
import torch.nn.functional as F

from export.onnx.forms import fused_projections, residual_sums
from tests.conftest import card, on_shared
from zoo.blocks.attention import Attention, build_mask
from zoo.blocks.feedforward import GeluFeedForward, gelu_tanh


def test_gelu_block_equals_torch_exact_gelu() -> None:
    torch.manual_seed(0)
    block = GeluFeedForward(8, 16, dropout=0.0, bias=True).eval()
    x = torch.randn(2, 5, 8) * 3
    hidden = x @ block.up.weight.T + block.up.bias
    expected = torch.nn.GELU()(hidden) @ block.down.weight.T + block.down.bias  # erf GELU
    with torch.no_grad():
        torch.testing.assert_close(block(x), expected, atol=1e-6, rtol=1e-5)


def test_gelu_tanh_equals_torch_tanh_gelu() -> None:
    x = torch.linspace(-8, 8, 4001)
    torch.testing.assert_close(gelu_tanh(x), F.gelu(x, approximate="tanh"), atol=1e-6, rtol=1e-5)


def test_additive_mask_attention_equals_torch_sdpa_with_a_boolean_mask() -> None:
    """Causal and left padding, past of 2: torch's scaled_dot_product_attention is the
    reference; padded query rows (every key masked) are not compared."""
    torch.manual_seed(0)
    attention = Attention(16, 4, dropout=0.0, bias=True).eval()
    x, past = torch.randn(2, 3, 16), (torch.randn(2, 4, 2, 4), torch.randn(2, 4, 2, 4))
    padding = torch.tensor([[0, 0, 1, 1, 1], [1, 1, 1, 1, 1]])
    mask = build_mask(padding, 3, 5, causal=True)
    with torch.no_grad():
        out, _ = attention(x, mask=mask, past=past)
        q = attention.split_heads(attention.query(x))
        k = torch.cat([past[0], attention.split_heads(attention.key(x))], dim=2)
        v = torch.cat([past[1], attention.split_heads(attention.value(x))], dim=2)
        allowed = torch.ones(3, 5).tril(diagonal=2).bool()[None, None] & padding.bool()[
            :, None, None, :]
        merged = F.scaled_dot_product_attention(q, k, v, attn_mask=allowed)
        expected = attention.out(merged.transpose(1, 2).reshape(2, 3, 16))
    torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-4)
    assert mask.dtype == torch.float32 and set(mask.unique().tolist()) == {
        0.0, torch.finfo(torch.float32).min}


def test_residual_sums_turn_only_the_add_that_feeds_a_norm() -> None:
    from onnx import TensorProto, helper, numpy_helper

    bias = numpy_helper.from_array(np.ones(4, np.float32), "bias")
    nodes = [helper.make_node("Add", ["x", "bias"], ["biased"]),  # a bias add: stays
             helper.make_node("Add", ["biased", "y"], ["summed"]),  # the residual: Sum
             helper.make_node("LayerNormalization", ["summed", "bias"], ["out"])]
    value = lambda name: helper.make_tensor_value_info(name, TensorProto.FLOAT, [2, 4])  # noqa: E731
    model = helper.make_model(helper.make_graph(nodes, "g", [value("x"), value("y")],
                                                [value("out")], [bias]))
    assert residual_sums(model) == 1
    assert [node.op_type for node in model.graph.node] == ["Add", "Sum", "LayerNormalization"]


def _session_graph(path: Path, tmp_path: Path) -> Counter:
    """Operator counts of the graph a default CPU session runs."""
    options = ort.SessionOptions()
    options.optimized_model_filepath = str(tmp_path / "session.onnx")
    ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    return Counter(node.op_type for node in onnx.load(options.optimized_model_filepath).graph.node)


@pytest.mark.parametrize("name", [pytest.param(name, marks=on_shared(name))
                                  for name in ("bert-tiny", "gpt-tiny")])
def test_a_default_session_runs_the_fast_forms(name: str, shared_export, tmp_path: Path) -> None:
    """No SkipLayerNormalization (its CPU kernel is the slow one), no per-layer Where or Div:
    the mask is built once and the scale rides in the attention MatMul; BERT's GELU runs as
    BiasGelu, GPT-2's as FastGelu; each layer's Q, K and V are one MatMul and a Split."""
    folder, _ = shared_export(name)
    ops = _session_graph(folder / "onnx/model.onnx", tmp_path)
    layers = card(name)["n_layers"]
    assert ops["SkipLayerNormalization"] == 0
    assert ops["Sum"] >= layers
    assert ops["Where"] <= 1 and ops["Div"] <= 1
    assert ops["FusedMatMul"] == layers  # Q K^T with the scale as its alpha
    if card(name)["activation"] == "gelu":  # every layer's, and the MLM head's transform
        assert ops["BiasGelu"] == layers + 1 and ops["Erf"] == 0
    if card(name)["activation"] == "gelu_tanh":
        assert ops["FastGelu"] == layers and ops["Tanh"] == 0
    assert ops["Split"] == layers


def _projections(bias: bool) -> onnx.ModelProto:
    """x @ Wq + bq, x @ Wk + bk, x @ Wv + bv (ONNX's MatMul/Add), and one MatMul of another
    input that must stay apart."""
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    tensors, nodes, outputs = [], [], []
    for index, width in enumerate((4, 4, 6)):
        tensors.append(numpy_helper.from_array(rng.standard_normal((4, width), np.float32),
                                               f"w{index}"))
        nodes.append(helper.make_node("MatMul", ["x", f"w{index}"], [f"m{index}"]))
        outputs.append(helper.make_tensor_value_info(f"m{index}", TensorProto.FLOAT,
                                                     [2, 3, width]))
        if bias:
            tensors.append(numpy_helper.from_array(rng.standard_normal(width).astype(np.float32),
                                                   f"b{index}"))
            nodes.append(helper.make_node("Add", [f"b{index}", f"m{index}"], [f"y{index}"]))
            outputs[-1] = helper.make_tensor_value_info(f"y{index}", TensorProto.FLOAT,
                                                        [2, 3, width])
    nodes.append(helper.make_node("MatMul", ["z", "w0"], ["other"]))
    outputs.append(helper.make_tensor_value_info("other", TensorProto.FLOAT, [2, 3, 4]))
    inputs = [helper.make_tensor_value_info(name, TensorProto.FLOAT, [2, 3, 4])
              for name in ("x", "z")]
    graph = helper.make_graph(nodes, "g", inputs, outputs, tensors)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=9)


@pytest.mark.parametrize("bias", [True, False])
def test_fused_projections_give_the_same_outputs(bias: bool) -> None:
    """One MatMul (+ one Add) + Split in place of three, outputs equal to the unfused graph's
    (the reference: the same graph before the rewrite, run by ONNX Runtime)."""
    model = _projections(bias)
    feeds = {name: np.random.default_rng(1).standard_normal((2, 3, 4), np.float32)
             for name in ("x", "z")}
    run = lambda m: ort.InferenceSession(m.SerializeToString(),  # noqa: E731
                                         providers=["CPUExecutionProvider"]).run(None, feeds)
    expected = run(model)
    assert fused_projections(model) == 2
    onnx.checker.check_model(model, full_check=True)
    ops = Counter(node.op_type for node in model.graph.node)
    assert ops == Counter({"MatMul": 2, "Split": 1, **({"Add": 1, "Concat": 1} if bias else {})})
    for got, want in zip(run(model), expected, strict=True):
        np.testing.assert_array_equal(got, want)


def test_scale_and_mask_are_one_multiply_and_one_add_per_layer() -> None:
    """The scale is 1/sqrt(head_dim) on Q (the reference: the paper's formula, spelled out)."""
    torch.manual_seed(1)
    attention = Attention(16, 2, dropout=0.0, bias=False).eval()
    x = torch.randn(1, 3, 16)
    with torch.no_grad():
        out, _ = attention(x)
        q, k, v = (attention.split_heads(layer(x)) for layer in
                   (attention.query, attention.key, attention.value))
        weights = torch.softmax(q @ k.transpose(-2, -1) / math.sqrt(8), dim=-1)
        expected = attention.out((weights @ v).transpose(1, 2).reshape(1, 3, 16))
    torch.testing.assert_close(out, expected, atol=1e-6, rtol=1e-5)


def test_cross_attention_with_the_scale_in_its_projection_is_the_papers_formula() -> None:
    """Cross-attention scales the query's projection (x (W s) + b s) instead of the query:
    the same softmax(q k^T / sqrt(d_k)) v, spelled out here with the keys and values of a
    memory projected once."""
    torch.manual_seed(2)
    attention = Attention(16, 4, dropout=0.0, bias=True).eval()
    x, memory = torch.randn(2, 3, 16), torch.randn(2, 5, 16)
    with torch.no_grad():
        out, _ = attention(x, past=attention.project(memory), cross=True)
        q, k, v = (attention.split_heads(layer(source)) for layer, source in
                   ((attention.query, x), (attention.key, memory), (attention.value, memory)))
        weights = torch.softmax(q @ k.transpose(-2, -1) / math.sqrt(4), dim=-1)
        expected = attention.out((weights @ v).transpose(1, 2).reshape(2, 3, 16))
    torch.testing.assert_close(out, expected, atol=1e-6, rtol=1e-5)


@on_shared("transformer-tiny")
def test_a_decoding_steps_cross_scores_run_with_alpha_one(shared_export, tmp_path: Path) -> None:
    """In the graph a default session runs, each layer's cross-attention scores are one
    FusedMatMul of the query by the cross keys (transposed in place) with alpha 1: MLAS runs a
    one-row product with alpha 1 by its kernel that reads the keys where they lie, and with any
    other alpha packs (copies) every head's keys first, every step (issue #26, BENCHMARKS.md)."""
    folder, _ = shared_export("transformer-tiny")
    options = ort.SessionOptions()
    options.optimized_model_filepath = str(tmp_path / "session.onnx")
    ort.InferenceSession(str(folder / "decoder.onnx"), options,
                         providers=["CPUExecutionProvider"])
    graph = onnx.load(options.optimized_model_filepath, load_external_data=False).graph
    scores = [node for node in graph.node
              if any(".encoder.key" in name for name in node.input)]
    assert len(scores) == card("transformer-tiny")["n_layers"]
    for node in scores:
        attributes = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
        assert node.op_type == "FusedMatMul" and attributes["transB"] == 1
        assert attributes["alpha"] == 1.0
