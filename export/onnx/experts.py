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

Weights the card does not renormalise (OLMoE's: the softmax's top k as they are) run through
the same node with `normalize_routing_weights` 1, its output times each token's top-k sum S:
sum_k p_k E_k(x) = S * sum_k (p_k / S) E_k(x), exact up to rounding. The node with 0 is not
used: it matched the block alone (3e-6), yet inside the shared-cache graph it added nothing at
all (logits equal to the graph's with each MoE node replaced by zeros; moe-tiny with
norm_topk_prob false, every optimisation level and memory setting), and exact again when its
input or output was made a graph output, so ONNX Runtime could not give the output the input's
buffer: a fault in ONNX Runtime 1.31's buffer planning or kernel, not proven which. QMoE's CPU
kernel renormalises whatever the attribute says (quantize_experts.py), so the rescaled node
holds there too.
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
    logits = block.router(tokens)
    out = torch.onnx.ops.symbolic(
        "com.microsoft::MoE", (tokens, logits, fc1, fc1_bias, fc2, fc2_bias),
        {"k": block.k, "activation_type": "swiglu", "swiglu_fusion": 1,
         "normalize_routing_weights": 1, "activation_alpha": 1.0,
         "activation_beta": 0.0, "swiglu_limit": NO_LIMIT},
        dtype=x.dtype, shape=tokens.shape, version=1)
    if not block.normalise:  # back to the unrenormalised weights: times the top-k sum
        top_sum = logits.float().softmax(dim=-1).topk(block.k, dim=-1).values.sum(-1, True)
        out = out * top_sum.to(out.dtype)
    return out.reshape(x.shape)


@contextlib.contextmanager
def experts_operator(model: nn.Module) -> Iterator[bool]:
    """Within the block, every mixture of experts in `model` runs as ONNX Runtime's operator
    (for tracing only: eagerly the symbolic node computes nothing); yields whether any does."""
    blocks = moe_blocks(model)
    try:
        for block in blocks:
            block.operator = onnx_runtime_moe
        yield bool(blocks)
    finally:
        for block in blocks:
            block.operator = None
