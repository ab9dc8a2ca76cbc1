"""A GGUF file read by walking its header within the file: every count and length it gives
(the key and tensor counts, each string's and array's length, a tensor's dimensions, type and
data: its offset and size in the data section) checked against the bytes left before anything
is looped over or kept, every string decoded as UTF-8; refused in one line naming the key or
tensor. gguf's own GGUFReader believes them (it loops over a claimed 10^12 array elements past
the end of a 43 KB file, growing without bound) and keeps one numpy object per array element
(700 MB and 19 s for a 1 MB array, measured): here an array of numbers is one numpy array and
a tensor a view of the mapped file. The gguf package gives ggml's type table and dequantizes.

The layout (GGUF v2 and v3, ggml/docs/gguf.md): magic, version (uint32), tensor count and key
count (uint64); each key: string name, value type (uint32), value; each tensor: string name,
dimension count (uint32), dimensions (uint64 each), ggml type (uint32), offset (uint64) into the
data section, which starts at the next multiple of `general.alignment` (32 unless set). A string
is a uint64 length and its bytes; an array an element type (uint32), a uint64 length and the
elements. Either byte order (the version tells which).
"""

from __future__ import annotations

import mmap
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from registry.errors import ZooError, needs_package
from registry.paths import display_path

MAGIC, VERSIONS = b"GGUF", (2, 3)
STRING, ARRAY = 8, 9
SCALARS = {0: ("B", "uint8"), 1: ("b", "int8"), 2: ("H", "uint16"), 3: ("h", "int16"),
           4: ("I", "uint32"), 5: ("i", "int32"), 6: ("f", "float32"), 7: ("?", "bool"),
           10: ("Q", "uint64"), 11: ("q", "int64"), 12: ("d", "float64")}  # type: (struct, name)
KEY_BYTES = 8 + 4 + 1  # the fewest a key takes: an empty name, its type, a one-byte value
TENSOR_BYTES = 8 + 4 + 4 + 8  # the fewest a tensor's entry takes: no name, no dimensions
MAX_DIMS = 4  # ggml's GGML_MAX_DIMS
MAX_SPAN = 1 << 59  # values a tensor's dimensions span, zeros aside: float64 in numpy's 2^63 bytes
DEFAULT_ALIGNMENT = 32


class GGUFError(ZooError):
    """A GGUF file the zoo cannot import as it is."""


@dataclass
class Field:
    """One key's value as gguf's reader gives it (`contents()`), and its type's name:
    `string`, `uint32`, `array[string]`, ..."""
    type: str
    value: Any

    def contents(self) -> Any:
        return self.value.tolist() if isinstance(self.value, np.ndarray) else self.value


@dataclass
class Tensor:
    name: str
    dims: tuple[int, ...]  # as the file lists them, ne0 (the row's length) first
    kind: Any  # gguf.GGMLQuantizationType
    offset: int  # in the data section
    nbytes: int
    data: np.ndarray = field(default_factory=lambda: np.empty(0))  # as gguf's reader gives it


@dataclass
class GGUFFile:
    """The file's keys and tensors in its order, every tensor's data a view of the file."""
    version: int
    fields: dict[str, Field] = field(default_factory=dict)
    tensors: list[Tensor] = field(default_factory=list)


def read_gguf(path: Path) -> GGUFFile:
    """The GGUF file at `path`, every count and length in its header checked against the
    file's size; refused in one line (file, key or tensor, what was expected)."""
    where = display_path(path)
    needs_package("gguf", where)  # ggml's type table
    size = path.stat().st_size
    if size < 4 + 4 + 8 + 8:
        raise GGUFError(f"{where}: not a readable GGUF file: {size} bytes, too short for a header")
    with path.open("rb") as handle, mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ) as data:
        walk = _Walk(data, where)
        found, start = walk.header()
    mapped = np.memmap(path, mode="r")
    for tensor in found.tensors:
        tensor.data = _tensor_data(mapped[start + tensor.offset:][:tensor.nbytes], tensor,
                                   walk.order)
    return found


def _tensor_data(raw: np.ndarray, tensor: Tensor, order: str) -> np.ndarray:
    """The tensor's bytes as gguf's reader shapes them: floats as floats, rows of
    quantized blocks as bytes."""
    from gguf.quants import quant_shape_to_byte_shape

    shape = tuple(reversed(tensor.dims))
    floats = {"F32": np.float32, "F16": np.float16}
    if tensor.kind.name in floats:
        return raw.view(np.dtype(floats[tensor.kind.name]).newbyteorder(order)).reshape(shape)
    return raw.reshape(quant_shape_to_byte_shape(shape, tensor.kind))


class _Walk:
    """A cursor over the mapped file that reads nothing it has not checked fits."""

    def __init__(self, data: mmap.mmap, where: str) -> None:
        self.data, self.where, self.at, self.order = data, where, 0, "<"
        self.names = set[str]()

    def fail(self, what: str) -> GGUFError:
        return GGUFError(f"{self.where}: {what}")

    def take(self, count: int, what: str) -> int:
        """The offset of the next `count` bytes, which must be in the file."""
        left = len(self.data) - self.at
        if count > left:
            raise self.fail(f"{what} needs {count:,} bytes at offset {self.at:,}, "
                            f"but the file ends {left:,} bytes later")
        start, self.at = self.at, self.at + count
        return start

    def number(self, code: str, what: str) -> int | float | bool:
        fmt = self.order + code
        return struct.unpack_from(fmt, self.data, self.take(struct.calcsize(fmt), what))[0]

    def string(self, what: str) -> str:
        length = self.number("Q", f"{what}'s length")
        start = self.take(length, f"{what} ({length:,} bytes)")
        try:
            return self.data[start:start + length].decode("utf-8")
        except UnicodeDecodeError as exc:
            raise self.fail(f"{what} is not UTF-8 text (byte {exc.start} of {length})") from None

    def header(self) -> tuple[GGUFFile, int]:
        """(the file's keys and tensors, where its data section starts)."""
        if self.data[:4] != MAGIC:
            raise self.fail(f"not a readable GGUF file: it starts {self.data[:4]!r}, not {MAGIC!r}")
        self.at = 4
        version = self.number("I", "the version")
        if version & 0xFFFF == 0:  # written on a machine of the other byte order
            self.order, self.at = ">", 4
            version = self.number("I", "the version")
        if version not in VERSIONS:
            raise self.fail(f"not a readable GGUF file: version {version}, not 2 or 3")
        tensors, keys = self.number("Q", "the tensor count"), self.number("Q", "the key count")
        left = len(self.data) - self.at
        if keys * KEY_BYTES > left:
            raise self.fail(f"the header claims {keys:,} metadata keys, but the {left:,} bytes "
                            f"left hold at most {left // KEY_BYTES:,}")
        if tensors * TENSOR_BYTES > left - keys * KEY_BYTES:
            raise self.fail(f"the header claims {tensors:,} tensors, but the {left:,} bytes "
                            f"left hold at most {left // TENSOR_BYTES:,}")
        found = GGUFFile(version)
        for _ in range(keys):
            key = self.string(f"metadata key {len(found.fields)}'s name")
            if key in found.fields:
                raise self.fail(f"{key} is set twice")
            found.fields[key] = self.value(key)
        alignment = self.alignment(found.fields.get("general.alignment"))
        found.tensors = [self.tensor_info(i) for i in range(tensors)]
        start = -(-self.at // alignment) * alignment  # the data section's first byte
        for tensor in found.tensors:
            if tensor.offset % alignment:
                raise self.fail(f"tensor {tensor.name}: offset {tensor.offset:,} is not a "
                                f"multiple of the alignment {alignment}")
            if start + tensor.offset + tensor.nbytes > len(self.data):
                raise self.fail(f"tensor {tensor.name}: {tensor.kind.name} {list(tensor.dims)} "
                                f"needs {tensor.nbytes:,} bytes at offset "
                                f"{start + tensor.offset:,}, but the file has {len(self.data):,}")
        return found, start

    def alignment(self, given: Field | None) -> int:
        if given is None:
            return DEFAULT_ALIGNMENT
        if given.type != "uint32" or given.value <= 0 or given.value & (given.value - 1):
            raise self.fail(f"general.alignment={given.value!r} ({given.type}): expected a "
                            "power of two as uint32")
        return given.value

    def value(self, key: str) -> Field:
        kind = self.number("I", f"{key}'s type")
        if kind == STRING:
            return Field("string", self.string(key))
        if kind in SCALARS:
            code, name = SCALARS[kind]
            return Field(name, self.number(code, key))
        if kind != ARRAY:
            raise self.fail(f"{key} has value type {kind}, which GGUF does not define")
        inner = self.number("I", f"{key}'s element type")
        length = self.number("Q", f"{key}'s length")
        if inner != STRING and inner not in SCALARS:
            raise self.fail(f"{key} is an array of type {inner}: expected numbers or strings")
        left = len(self.data) - self.at
        if inner == STRING:  # each a length and its bytes
            if length * 8 > left:
                raise self.fail(f"{key} claims {length:,} strings, but the {left:,} bytes left "
                                f"hold at most {left // 8:,}")
            return Field("array[string]", [self.string(f"{key}[{i}]") for i in range(length)])
        code, name = SCALARS[inner]
        dtype = np.dtype(self.order + code)
        start = self.take(length * dtype.itemsize, f"{key} ({length:,} {name})")
        return Field(f"array[{name}]", np.frombuffer(self.data, dtype, length, start).copy())

    def tensor_info(self, index: int) -> Tensor:
        from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType

        name = self.string(f"tensor {index}'s name")
        if name in self.names:
            raise self.fail(f"tensor {name} is listed twice")
        self.names.add(name)
        count = self.number("I", f"tensor {name}'s dimension count")
        if not 1 <= count <= MAX_DIMS:
            raise self.fail(f"tensor {name} has {count:,} dimensions: ggml allows 1 to {MAX_DIMS}")
        dims = tuple(self.number("Q", f"tensor {name}'s dimensions") for _ in range(count))
        raw = self.number("I", f"tensor {name}'s type")
        try:
            kind = GGMLQuantizationType(raw)
            block, block_bytes = GGML_QUANT_SIZES[kind]
        except (ValueError, KeyError):
            raise self.fail(f"tensor {name} has ggml type {raw}, which ggml does not define") \
                from None
        offset = self.number("Q", f"tensor {name}'s offset")
        if dims and dims[0] % block:
            raise self.fail(f"tensor {name}: {kind.name} {list(dims)}: a row of {dims[0]} is not "
                            f"a whole number of {block}-value blocks")
        elements, span = 1, 1
        for dim in dims:
            elements, span = elements * dim, span * max(dim, 1)
        if span > MAX_SPAN:  # numpy cannot shape it, even empty
            raise self.fail(f"tensor {name}: dimensions {list(dims)} span more than 2^59 values")
        return Tensor(name, dims, kind, offset, elements // block * block_bytes)
