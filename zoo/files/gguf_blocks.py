"""A GGUF file's own quantized blocks, kept in an imported folder beside its fp32 weights.

gguf_blocks.safetensors holds, under each zoo weight name, the tensor's raw ggml blocks as a
uint8 (rows, row bytes) array, its rows in the zoo's order (the import reorders the query and
key rows of a Llama file, whole rows of blocks, as it reorders the fp32 rows), so that gguf's
dequantize of the stored blocks is, bit for bit, the fp32 weight the folder holds.
gguf_blocks.json says each one's ggml type, (rows, columns) and name in the file. Float tensors
(F32, F16, BF16) are not stored: the fp32 weights are them. `zoo export --quantize gguf` reads
both (export/onnx/gguf_export.py).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from registry.errors import ZooError
from registry.paths import display_path

BLOCKS_FILE, BLOCKS_INDEX = "gguf_blocks.safetensors", "gguf_blocks.json"
FLOATS = ("F32", "F16", "BF16", "F64")


@dataclass(frozen=True)
class Blocks:
    """One weight's blocks: `raw` (rows, row bytes) of `ggml_type`, dequantizing to `shape`."""

    ggml_type: str
    shape: tuple[int, int]  # (rows, columns) = (output features, input features)
    raw: np.ndarray
    source: str  # the tensor's name in the file


@dataclass
class BlockStore:
    """The blocks the import collects, by zoo weight name."""

    found: dict[str, Blocks] = field(default_factory=dict)

    @staticmethod
    def rows(tensor: Any, shape: tuple[int, ...]) -> np.ndarray | None:
        """A quantized 2-D tensor's bytes as (rows, row bytes); None for floats and vectors."""
        if tensor.kind.name in FLOATS or len(shape) != 2:
            return None
        return np.asarray(tensor.data, np.uint8).reshape(shape[0], -1)

    @staticmethod
    def expert_rows(tensor: Any, shape: tuple[int, ...]) -> np.ndarray | None:
        """A quantized fused-expert tensor's bytes as (experts, rows, row bytes)."""
        if tensor.kind.name in FLOATS:
            return None
        return np.asarray(tensor.data, np.uint8).reshape(shape[0], shape[1], -1)

    def add(self, name: str, tensor: Any, raw: np.ndarray, shape: tuple[int, ...]) -> None:
        self.found[name] = Blocks(tensor.kind.name, (int(shape[0]), int(shape[1])),
                                  np.ascontiguousarray(raw), tensor.name)


def write_blocks(store: BlockStore, folder: Path) -> None:
    """Both files into `folder` (the import's staging folder: it lands whole or not at all);
    nothing when the file held no quantized tensor."""
    from safetensors.numpy import save_file

    if not store.found:
        return
    save_file({name: blocks.raw for name, blocks in store.found.items()},
              str(folder / BLOCKS_FILE))
    (folder / BLOCKS_FILE).chmod(0o644)  # as the folder's other files (save_file: 0600)
    index = {name: {"type": blocks.ggml_type, "shape": list(blocks.shape),
                    "gguf": blocks.source} for name, blocks in store.found.items()}
    (folder / BLOCKS_INDEX).write_text(json.dumps(index, indent=2) + "\n", encoding="utf-8")


def read_blocks(folder: Path) -> dict[str, Blocks]:
    """The folder's blocks, by zoo weight name; a folder without them, or whose two files
    disagree, is refused in one line that says what to do."""
    from safetensors import SafetensorError
    from safetensors.numpy import load_file

    index_path, data_path = Path(folder) / BLOCKS_INDEX, Path(folder) / BLOCKS_FILE
    if not index_path.is_file() or not data_path.is_file():
        raise ZooError(f"{display_path(folder)}: no {BLOCKS_INDEX} and {BLOCKS_FILE}: "
                       "--quantize gguf exports a folder made by `zoo import FILE.gguf` "
                       "(re-import the file to add them)")
    where = display_path(index_path)
    try:
        index = json.loads(index_path.read_text(encoding="utf-8"))
        arrays = load_file(str(data_path))
    except (ValueError, OSError, SafetensorError) as exc:
        raise ZooError(f"{where}: not readable: {str(exc).splitlines()[0]}") from exc
    if not isinstance(index, dict) or set(index) != set(arrays):
        raise ZooError(f"{where}: its names are not {display_path(data_path)}'s")
    found = {}
    for name, entry in index.items():
        if not isinstance(entry, dict) or not isinstance(entry.get("type"), str) or \
                not _pair(entry.get("shape")):
            raise ZooError(f"{where}: {name}: expected {{type, shape: [rows, columns], gguf}}")
        raw = arrays[name]
        if raw.dtype != np.uint8 or raw.ndim != 2 or raw.shape[0] != entry["shape"][0]:
            raise ZooError(f"{where}: {name}: {raw.dtype} {list(raw.shape)} is not "
                           f"{entry['shape'][0]} rows of uint8 blocks")
        found[name] = Blocks(entry["type"], tuple(entry["shape"]), raw,
                             str(entry.get("gguf", name)))
    return found


def _pair(value: Any) -> bool:
    return isinstance(value, list) and len(value) == 2 and all(
        isinstance(item, int) and item > 0 for item in value)
