"""What ONNX Runtime's GroupQueryAttention accepts, as data, and where the shared-cache graph's
rotary goes for a head size.

The rules are the shape checks of onnxruntime's
`contrib_ops/cpu/bert/group_query_attention_helper.h` (`CheckInputs`, `Check_Q_K_V`,
`CheckRotaryCaches`), which the CPU and CUDA kernels both run before any computation: they do
not depend on the CPU's instruction set (AVX2, AVX-512 with VNNI, AVX-512 FP16 with AMX pick
how the kernel computes, not what it takes) nor on the sequence length, except that the cos and
sin caches must hold a row for every position (the zoo's hold max_positions).
tests/export/test_gqa_rules.py runs each rule against ONNX Runtime over head sizes 4 to 256, with
rotary in and out of the kernel, at several sequence lengths and past lengths.

So: a head size that is a multiple of 16 rotates in the kernel (do_rotary, its cos and sin
caches); a multiple of 8 that is not (8, 24, 40, ...) runs the kernel with queries and keys
rotated before it, as the plain graph rotates them (about twenty nodes a layer more); any other
head size cannot use the kernel at all: `--optimize` then makes no shared-cache graph and keeps
its other fusions (the manifest's `attention` says why)."""

from __future__ import annotations

from dataclasses import dataclass

HEAD_MULTIPLE = 8  # Check_Q_K_V: "head_size must be a multiple of 8"
ROTARY_HEAD_MULTIPLE = 16  # CheckRotaryCaches: "head_size shall be a multiple of 16"


@dataclass(frozen=True)
class AttentionPlan:
    """How a decoder's attention runs in the shared-cache graph, and why (for the manifest)."""

    runs: bool  # GroupQueryAttention accepts this head size
    rotary_in_kernel: bool
    why: str


def attention_plan(head_dim: int, rotary: bool) -> AttentionPlan:
    if head_dim % HEAD_MULTIPLE:
        return AttentionPlan(False, False, f"head size {head_dim} is not a multiple of "
                             f"{HEAD_MULTIPLE}, which GroupQueryAttention needs")
    if not rotary:
        return AttentionPlan(True, False, "no rotary positions")
    if head_dim % ROTARY_HEAD_MULTIPLE:
        return AttentionPlan(True, False, f"rotary before the kernel: head size {head_dim} is "
                             f"not a multiple of {ROTARY_HEAD_MULTIPLE}, which the kernel's own "
                             "rotary needs")
    return AttentionPlan(True, True, "rotary in the kernel (do_rotary, cos and sin caches)")
