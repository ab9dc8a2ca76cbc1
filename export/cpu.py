"""What this CPU offers for quantized kernels, read from /proc/cpuinfo (Linux; elsewhere none
is known): benchmarks print it beside their figures, and --quantize int8-dynamic chooses its
weight range by it."""

from __future__ import annotations

from pathlib import Path

FLAGS = ("avx2", "avx512f", "avx512_vnni", "avx512_bf16", "amx_tile", "avx_vnni")
VNNI = ("avx512_vnni", "avx_vnni", "amx_tile")


def cpu_flags() -> list[str]:
    """Those of FLAGS the first CPU lists, in FLAGS' order."""
    try:
        text = Path("/proc/cpuinfo").read_text(encoding="utf-8")
    except OSError:
        return []
    line = next((entry for entry in text.splitlines() if entry.startswith("flags")), "")
    present = set(line.split(":", 1)[-1].split())
    return [flag for flag in FLAGS if flag in present]


def has_vnni() -> bool:
    """u8 x s8 dot products without the 16-bit intermediate that saturates on AVX2 alone."""
    return any(flag in VNNI for flag in cpu_flags())
