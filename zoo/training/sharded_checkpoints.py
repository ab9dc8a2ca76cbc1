"""Checkpoints of a sharded run (`--shard full`), written with torch.distributed.checkpoint
(DCP) in its safetensors form: each rank writes its own shard of the model and of Adam's
moments, no rank gathers the whole model, and a resume on any number of ranks reads the slices
it needs (DCP reshards). Never pickle: DCP's default `.metadata` file is a pickle, so the
Hugging Face storage writer is used, whose shard files carry their offsets in the
safetensors header.

Layout of OUT/checkpoints/step-00000100/ (beside the unsharded checkpoints' names):
    shard-0000R-model-00001-of-00001.safetensors   rank R-1's slices (model.*, optimizer.*)
    shards.json      the index: each shard file's size and tensors (offset, shape), and each
                     tensor's whole shape and dtype; a shard that disagrees is refused by name
    trainer.json     step, losses, options, Adam's param groups (as checkpoints.py)
    config.yaml      the card, so the folder consolidates on its own

`consolidate` streams a checkpoint into one model.safetensors, a tensor at a time: the most it
holds is one whole tensor."""

from __future__ import annotations

import contextlib
import json
import math
import shutil
import struct
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from safetensors import SafetensorError, safe_open
from torch import nn
from torch.distributed.checkpoint import HuggingFaceStorageReader, HuggingFaceStorageWriter
from torch.distributed.checkpoint.state_dict import (
    get_model_state_dict,
    get_optimizer_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
)
from torch.distributed.tensor import DTensor

from registry.errors import ZooError
from registry.paths import display_path, inside
from runtime.files.atomic import atomic_folder, atomic_write_bytes, current_umask
from runtime.files.tokenizer import tokenizer_files
from zoo.files.weights import CONFIG, WEIGHTS
from zoo.training.checkpoints import CHECKPOINTS, KEEP, LATEST, SHARDS, TRAINER

MODEL, OPTIMIZER = "model", "optimizer"  # the two parts of the saved state, key prefixes
SHARDING_INFO = "DCP_SHARDING_INFO"  # DCP's header key: each tensor's saved_offsets
DTYPES = {"F64": torch.float64, "F32": torch.float32, "F16": torch.float16,
          "BF16": torch.bfloat16, "I64": torch.int64, "I32": torch.int32}


def is_sharded(folder: Path) -> bool:
    return (Path(folder) / SHARDS).is_file()


def _state(model: nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
    """What DCP saves and loads in place: the model's and Adam's tensors by parameter name
    (a fresh Adam's state is made, zeros, so that there is something to load into)."""
    return {MODEL: get_model_state_dict(model),
            OPTIMIZER: get_optimizer_state_dict(model, optimizer)["state"]}


def local_bytes(tensors: dict[str, Any]) -> int:
    """Bytes of the tensors this rank holds (a DTensor counts its local shard)."""
    total = 0
    for value in tensors.values():
        if isinstance(value, dict):
            total += local_bytes(value)
        elif isinstance(value, torch.Tensor):
            local = value.to_local() if isinstance(value, DTensor) else value
            total += local.numel() * local.element_size()
    return total


def optimizer_bytes_per_rank(model: nn.Module, optimizer: torch.optim.Optimizer) -> list[int]:
    """Each rank's Adam state in bytes, measured on its state dict's local shards."""
    mine = local_bytes(get_optimizer_state_dict(model, optimizer)["state"])
    every: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(every, mine)
    return [int(value) for value in every]


def save_sharded(out: Path, model: nn.Module, optimizer: torch.optim.Optimizer,
                 trainer: dict[str, Any], card_yaml: str) -> None:
    """Every rank writes its shard of checkpoint `trainer['step']` into a staging folder that
    rank 0 completes (index, trainer state, card) and renames into place; `latest` moves
    after. OUT must be on a file system every rank sees."""
    root = Path(out) / CHECKPOINTS
    name = f"step-{trainer['step']:08d}"
    staging = root / f".{name}.partial"
    rank = dist.get_rank()
    if rank == 0:
        shutil.rmtree(staging, ignore_errors=True)  # a run killed while writing it
        staging.mkdir(parents=True)
    dist.barrier()
    dcp.save(_state(model, optimizer),
             storage_writer=HuggingFaceStorageWriter(str(staging), save_distributed=True))
    groups = [{k: v for k, v in group.items() if k != "params"}
              for group in optimizer.state_dict()["param_groups"]]
    if rank == 0:
        index = _index_of(staging)
        (staging / SHARDS).write_text(json.dumps(index, indent=1), encoding="utf-8")
        (staging / TRAINER).write_text(json.dumps({**trainer, "param_groups": groups,
                                                   "sharded": True}, indent=1),
                                       encoding="utf-8")
        (staging / CONFIG).write_text(card_yaml, encoding="utf-8")
        shutil.rmtree(root / name, ignore_errors=True)
        staging.rename(root / name)
        atomic_write_bytes(root / LATEST, name.encode())
        for old in sorted(p for p in root.glob("step-*") if p.is_dir())[:-KEEP]:
            shutil.rmtree(old, ignore_errors=True)
    dist.barrier()


def _header(path: Path) -> dict[str, dict[str, Any]]:
    """A shard file's tensors: name -> {offsets, shape, dtype}, from its safetensors header."""
    with safe_open(str(path), framework="pt") as handle:
        info = json.loads((handle.metadata() or {}).get(SHARDING_INFO, "{}"))
        found = {}
        for key in handle.keys():
            piece = handle.get_slice(key)
            shape = list(piece.get_shape())
            offsets = info.get(key, {}).get("saved_offsets", [0] * len(shape))
            found[key] = {"offsets": offsets, "shape": shape, "dtype": piece.get_dtype()}
    return found


def _index_of(folder: Path) -> dict[str, Any]:
    """The shards.json of a folder DCP has just written."""
    files, tensors = {}, {}
    for path in sorted(folder.glob("*.safetensors")):
        header = _header(path)
        files[path.name] = {"bytes": path.stat().st_size, "tensors": header}
        for key, piece in header.items():
            whole = tensors.setdefault(key, {"shape": [0] * len(piece["shape"]),
                                             "dtype": piece["dtype"]})
            whole["shape"] = [max(size, offset + length) for size, offset, length in
                              zip(whole["shape"], piece["offsets"], piece["shape"], strict=True)]
    return {"files": files, "tensors": tensors}


def read_index(folder: Path) -> dict[str, Any]:
    """shards.json, each shard file checked against it (present, its size, the tensors its
    header holds) and every tensor covered by its pieces; a mismatch is one line naming the
    file."""
    folder = Path(folder)
    path = folder / SHARDS
    try:
        index = json.loads(path.read_text(encoding="utf-8"))
        files, tensors = dict(index["files"]), dict(index["tensors"])
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise ZooError(f"{display_path(path)}: unreadable shard index: {exc}") from exc
    for name in sorted(files):
        shard = inside(folder, name, display_path(path), "shard file")
        expected = files[name]
        if not shard.is_file():
            raise ZooError(f"{display_path(shard)}: missing (listed in {SHARDS})")
        if shard.stat().st_size != expected.get("bytes"):
            raise ZooError(f"{display_path(shard)}: {shard.stat().st_size} bytes, {SHARDS} says "
                           f"{expected.get('bytes')} (truncated or replaced)")
        try:
            header = _header(shard)
        except (SafetensorError, OSError, ValueError, AttributeError, TypeError) as exc:
            raise ZooError(f"{display_path(shard)}: not a readable shard: {exc}") from exc
        if header != expected.get("tensors"):
            raise ZooError(f"{display_path(shard)}: its tensors do not match {SHARDS} (a shard "
                           "of another checkpoint or another run)")
    for stray in sorted(set(p.name for p in folder.glob("*.safetensors")) - set(files)):
        raise ZooError(f"{display_path(folder / stray)}: a shard file {SHARDS} does not list")
    for key, whole in tensors.items():
        pieces = [f["tensors"][key] for f in files.values() if key in f["tensors"]]
        if not _covered(whole, pieces):
            raise ZooError(f"{display_path(path)}: the shards do not cover {key} "
                           f"{whole.get('shape')} (or are of another dtype)")
    return index


def _covered(whole: dict[str, Any], pieces: list[dict[str, Any]]) -> bool:
    """The pieces lie inside the whole tensor, of its dtype, and add up to its size."""
    shape = whole.get("shape")
    if whole.get("dtype") not in DTYPES or not isinstance(shape, list):
        return False
    for piece in pieces:
        if piece["dtype"] != whole["dtype"] or \
                not len(piece["offsets"]) == len(piece["shape"]) == len(shape):
            return False
        if any(start < 0 or start + length > size for start, length, size in
               zip(piece["offsets"], piece["shape"], shape, strict=True)):
            return False
    return sum(math.prod(piece["shape"]) for piece in pieces) == math.prod(shape)


def load_sharded(folder: Path, model: nn.Module, optimizer: torch.optim.Optimizer,
                 trainer: dict[str, Any]) -> None:
    """Load a sharded checkpoint into a sharded model and its fresh Adam, on any number of
    ranks: DCP reads each rank's slices from whichever shard files hold them."""
    read_index(folder)  # every rank checks, so that a bad folder stops them all alike
    state = _state(model, optimizer)
    dcp.load(state, storage_reader=HuggingFaceStorageReader(str(folder)))
    set_model_state_dict(model, state[MODEL])
    groups = get_optimizer_state_dict(model, optimizer)["param_groups"]
    for group, saved in zip(groups, trainer["param_groups"], strict=True):
        group.update(saved)
    set_optimizer_state_dict(model, optimizer, {"state": state[OPTIMIZER],
                                                "param_groups": groups})


def _padded_header(header: dict[str, Any]) -> bytes:
    """A safetensors header: its length (8 bytes, little-endian) and JSON padded to 8."""
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    return struct.pack("<Q", len(text)) + text


def consolidate(folder: Path, target: Path, keep: str = MODEL) -> list[str]:
    """Write the `keep.*` tensors of a sharded checkpoint as one safetensors file at `target`
    (a new file, in a staging folder), streamed: each tensor assembled from its pieces,
    written, and dropped before the next. Returns the tensor names written."""
    index = read_index(folder)
    prefix = f"{keep}."
    names = sorted(key for key in index["tensors"] if key.startswith(prefix))
    header: dict[str, Any] = {"__metadata__": {"format": "pt"}}
    offset = 0
    for key in names:
        whole = index["tensors"][key]
        size = math.prod(whole["shape"]) * DTYPES[whole["dtype"]].itemsize
        header[key.removeprefix(prefix)] = {"dtype": whole["dtype"], "shape": whole["shape"],
                                            "data_offsets": [offset, offset + size]}
        offset += size
    with contextlib.ExitStack() as stack, Path(target).open("wb") as stream:
        handles = {name: stack.enter_context(safe_open(str(Path(folder) / name), "pt"))
                   for name in index["files"]}
        stream.write(_padded_header(header))
        for key in names:
            whole = index["tensors"][key]
            tensor = torch.empty(whole["shape"], dtype=DTYPES[whole["dtype"]])
            for name, shard in index["files"].items():
                piece = shard["tensors"].get(key)
                if piece is not None:
                    where = tuple(slice(start, start + length) for start, length in
                                  zip(piece["offsets"], piece["shape"], strict=True))
                    tensor[where] = handles[name].get_tensor(key)
            stream.write(tensor.reshape(-1).view(torch.uint8).numpy().tobytes())
    Path(target).chmod(0o666 & ~current_umask())
    return [key.removeprefix(prefix) for key in names]


def consolidate_folder(checkpoint: Path, out: Path, force: bool = False) -> list[str]:
    """`zoo import CHECKPOINT -o OUT`: a sharded checkpoint as a zoo model folder (config.yaml,
    model.safetensors streamed, the tokenizer of the training folder it lies in), written
    atomically. Returns the tensor names."""
    checkpoint = Path(checkpoint)
    trainer = _trainer(checkpoint)
    if trainer.get("options", {}).get("lora") not in (None, "None"):
        raise ZooError(f"{display_path(checkpoint)}: a --lora run's checkpoint; its training "
                       "folder holds the base's weights and the adapter (PEFT's layout)")
    read_index(checkpoint)  # before OUT is claimed
    training = checkpoint.parent.parent if checkpoint.parent.name == CHECKPOINTS else None
    tokenizers = tokenizer_files(training) if training is not None else []
    with atomic_folder(Path(out), force) as staging:
        shutil.copyfile(checkpoint / CONFIG, staging / CONFIG)
        names = consolidate(checkpoint, staging / WEIGHTS)
        for path in tokenizers:
            shutil.copyfile(path, staging / path.name)
    return names


def _trainer(checkpoint: Path) -> dict[str, Any]:
    path = checkpoint / TRAINER
    if not is_sharded(checkpoint):
        raise ZooError(f"{display_path(checkpoint)}: not a sharded checkpoint (no {SHARDS})")
    try:
        trainer = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ZooError(f"{display_path(path)}: unreadable trainer state: {exc}") from exc
    if not isinstance(trainer, dict) or not (checkpoint / CONFIG).is_file():
        raise ZooError(f"{display_path(checkpoint)}: a checkpoint folder holds {TRAINER} (an "
                       f"object) and {CONFIG}")
    return trainer
