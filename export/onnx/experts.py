"""A mixture of experts (zoo/blocks/experts.py) as ONNX Runtime's own `com.microsoft.MoE`
operator, for --optimize's shared-cache graph: its CPU kernel routes each token to its top k
experts only (the block's own graph runs every expert on every token), softmax, top k and the
renormalisation (`normalize_routing_weights`, the card's norm_topk_prob) included.

ONNX Runtime 1.31's CPU kernel takes SwiGLU experts only with the gate and up rows interleaved
in one (n_experts, 2 * moe_d_ff, d_model) matrix (`swiglu_fusion` 1; it refuses the other two
layouts at session creation), and computes G * sigmoid(alpha G) * (L + beta), with G clamped
above and L both ways at `swiglu_limit`: alpha 1, beta 0 and a limit no float reaches make it
silu(gate) * up. Its weights are 3-D, which the int4/int8 MatMulNBits quantizer does not reach:
--quantize int4/int8 makes the node ONNX Runtime's QMoE (quantize_experts.py). Checked against
the plain graph by the export's parity grid, as any --optimize.

Only for renormalised top-k weights (norm_topk_prob: Qwen3-MoE, Mixtral). With
`normalize_routing_weights` 0 (OLMoE's weights as the softmax gave them) the kernel matched
the block node by node (3e-6, any batch), yet the shared-cache graph then failed the grid's
left-padded 32-step loop (max abs 3.9 on two tiny random configurations, with per-head and
with projection qk-norm): not diagnosed, so such a mixture keeps the block's exact graph.
Narrowed down since (moe-tiny with norm_topk_prob false): the shared-cache graph is off from
the first prefill, padded or not, every input finite, at every graph optimisation level and
memory setting, and its logits equal exactly those of the graph with each MoE node replaced by
zeros: in that graph the kernel adds nothing. Making the node's input or its output a graph
output (so ONNX Runtime cannot give the output the input's buffer, which the kernel allows)
makes it exact, and so does normalize_routing_weights 1 in the same graph. Small graphs of the
same shape (Mul, Reshape, Gemm router, MoE, residual Add) computed it right, so the cause is
in ONNX Runtime's buffer planning or the kernel, not proven which.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch
from torch import nn

from zoo.blocks.experts import MixtureOfExperts, moe_blocks

OPERATOR = "com.microsoft.MoE"
NO_LIMIT = 3.0e38  # swiglu_limit: near float32's largest, so nothing is clamped


def _interleaved(first: torch.Tensor, second: torch.Tensor) -> torch.Tensor:
    """Rows g0, u0, g1, u1, ... of two (F, ...) tensors: (2F, ...)."""
    return torch.stack([first, second], dim=1).reshape(-1, *first.shape[1:])


def onnx_runtime_moe(block: MixtureOfExperts, x: torch.Tensor) -> torch.Tensor:
    """The block as one MoE node on its tokens (B * T, d)."""
    experts = list(block.experts)
    fc1 = torch.stack([_interleaved(e.gate.weight, e.up.weight) for e in experts])
    fc2 = torch.stack([e.down.weight for e in experts])
    biased = experts[0].gate.bias is not None
    fc1_bias = torch.stack([_interleaved(e.gate.bias, e.up.bias) for e in experts]) \
        if biased else None
    fc2_bias = torch.stack([e.down.bias for e in experts]) if biased else None
    tokens = x.reshape(-1, x.shape[-1])
    out = torch.onnx.ops.symbolic(
        "com.microsoft::MoE", (tokens, block.router(tokens), fc1, fc1_bias, fc2, fc2_bias),
        {"k": block.k, "activation_type": "swiglu", "swiglu_fusion": 1,
         "normalize_routing_weights": int(block.normalise), "activation_alpha": 1.0,
         "activation_beta": 0.0, "swiglu_limit": NO_LIMIT},
        dtype=x.dtype, shape=tokens.shape, version=1)
    return out.reshape(x.shape)


@contextlib.contextmanager
def experts_operator(model: nn.Module) -> Iterator[bool]:
    """Within the block, every mixture of experts in `model` with renormalised weights runs as
    ONNX Runtime's operator (for tracing only: eagerly the symbolic node computes nothing);
    yields whether any does."""
    blocks = [block for block in moe_blocks(model) if block.normalise]
    try:
        for block in blocks:
            block.operator = onnx_runtime_moe
        yield bool(blocks)
    finally:
        for block in blocks:
            block.operator = None
