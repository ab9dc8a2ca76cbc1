"""`zoo train --shard full`: PyTorch's FSDP2 (`fully_shard`) over the ranks torchrun starts.

Each of the zoo's layers (`zoo.blocks.layer.Layer`, whatever stack holds it: a decoder's
`layers`, an encoder-decoder's two) is one FSDP unit (its cross-attention one of its own, as
the model projects the encoder's output for it before the layer runs), and the root
(embeddings, final norm, heads) is the last: between forward passes every rank holds 1/N of
each parameter, its gradient and its Adam moments. FSDP owns the all-gathers, the
reduce-scatters and mixed precision; the zoo owns where the units begin and end, the data, the
checkpoints (sharded_checkpoints.py) and the folders."""

from __future__ import annotations

import copy
import os
import warnings
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.fsdp import (
    MixedPrecisionPolicy,
    fully_shard,
    register_fsdp_forward_method,
)

from registry.errors import ZooError
from zoo.blocks.layer import Layer

SHARD_MODES = ("none", "full")  # none: every rank holds the whole model (DDP)
MIXED_PRECISION = ("none", "bf16")
TORCHRUN_ENV = ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")  # what env:// reads


def check_launch(mixed_precision: str) -> None:
    """Refuse, in one line, --shard full outside torchrun and bf16 where the device lacks it."""
    missing = [name for name in TORCHRUN_ENV if name not in os.environ]
    if missing:
        raise ZooError("--shard full shards the model across the ranks of a process group: "
                       "launch with torchrun (torchrun --nproc_per_node N cli.py train ...; "
                       f"{', '.join(missing)} not set)")
    if mixed_precision == "bf16" and not bf16_supported():
        raise ZooError("--mixed-precision bf16: this device has no bfloat16 arithmetic "
                       "(CPU: AVX-512 BF16 or AMX; CUDA: compute capability 8.0 or newer)")


def bf16_supported() -> bool:
    """bfloat16 matrix arithmetic in hardware (on CPU, oneDNN's check of AVX-512 BF16/AMX)."""
    if torch.cuda.is_available():
        return torch.cuda.is_bf16_supported()
    return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())


def start_process_group() -> tuple[int, int]:
    """(rank, world size) of the process group torchrun describes, started if need be."""
    if not dist.is_initialized():
        dist.init_process_group("nccl" if torch.cuda.is_available() else "gloo")
    return dist.get_rank(), dist.get_world_size()


def rank_zeros(path: Path) -> Path:
    """Rank 0's `path` on every rank."""
    chosen = [str(path)]
    dist.broadcast_object_list(chosen, src=0)
    return Path(chosen[0])


def policy(mixed_precision: str) -> MixedPrecisionPolicy:
    """bf16: parameters gathered and computed in bfloat16, gradients reduced in float32 and
    the sharded master weights (what Adam updates and checkpoints hold) kept in float32."""
    if mixed_precision == "bf16":
        return MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    return MixedPrecisionPolicy()


def shard_model(model: nn.Module, mixed_precision: str = "none") -> int:
    """Shard `model` in place, one FSDP unit per layer then the root; returns the number of
    layer units. Parameters become DTensors sharded on their first dimension."""
    chosen = policy(mixed_precision)
    # A layer returns (hidden states, its cache), views that nothing changes in place; the
    # gradients are those of one process averaging the ranks' (tests/zoo/test_fsdp.py).
    warnings.filterwarnings("ignore", message="FSDP2-wrapped module .* returned a view tensor")
    layers = [module for module in model.modules() if isinstance(module, Layer)]
    for layer in layers:
        if layer.cross_attention is not None:  # projected apart, before its layer runs
            fully_shard(layer.cross_attention, mp_policy=chosen)  # (cross_cache), so a unit
            register_fsdp_forward_method(layer.cross_attention, "project")  # of its own
        fully_shard(layer, mp_policy=chosen)
    fully_shard(model, mp_policy=chosen)
    return len(layers)


def meta_twin(model: nn.Module) -> nn.Module:
    """A copy of `model` whose parameters are on the meta device (no memory; ties kept) and
    whose buffers are real: what rank 0 loads a consolidated checkpoint into at the end."""
    memo = {id(p): nn.Parameter(torch.empty_like(p, device="meta"), p.requires_grad)
            for p in model.parameters()}
    return copy.deepcopy(model, memo)
