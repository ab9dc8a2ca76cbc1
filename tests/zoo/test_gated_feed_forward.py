"""The gated feed-forwards (SwiGLU, GeGLU, GeGLU-tanh) against transformers' activations, and
their parameter counts against the modules."""

from __future__ import annotations

import pytest
import torch
from transformers.activations import ACT2FN

from registry import count_parameters
from tests.conftest import card, count_module_parameters
from zoo.assemble import build_model
from zoo.blocks.classes import build_block


@pytest.mark.parametrize(("activation", "reference"), [
    ("swiglu", "silu"), ("geglu", "gelu"), ("geglu_tanh", "gelu_pytorch_tanh")])
def test_gated_feed_forward_is_down_of_gate_activation_times_up(activation: str,
                                                                reference: str) -> None:
    tiny = card("gpt-tiny", activation=activation, bias=False)
    block = build_block("activation", tiny, 0).eval()
    x = torch.randn(2, 5, tiny["d_model"], generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        expected = block.down(ACT2FN[reference](block.gate(x)) * block.up(x))
        torch.testing.assert_close(block(x), expected, atol=1e-6, rtol=1e-6)


@pytest.mark.parametrize("activation", ["geglu", "geglu_tanh"])
@pytest.mark.parametrize("bias", [True, False])
def test_gated_parameter_count_is_the_modules(activation: str, bias: bool) -> None:
    tiny = card("gpt-tiny", activation=activation, bias=bias)
    assert sum(count_parameters(tiny.fields).values()) == count_module_parameters(build_model(tiny))
