"""A GGUF file's header walked within the file before gguf's reader sees it. gguf's GGUFReader
believes every count and length the header gives (it loops over a claimed 10^12 array elements
past the end of a 43 KB file, growing without bound), so each one is checked here against the
bytes that are left before anything is looped over or kept: the key and tensor counts, every
string's and array's length, a tensor's dimensions, type and data (its offset and size inside
the data section), and every string decoded as UTF-8. A file that passes holds what it claims;
one that does not is refused in one line naming the key or tensor.

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
MAX_ELEMENTS = 1 << 23  # array elements in all: gguf's reader keeps each as its own object
DEFAULT_ALIGNMENT = 32


class GGUFError(ZooError):
    """A GGUF file the zoo cannot import as it is."""


@dataclass
class Tensor:
    name: str
    dims: tuple[int, ...]  # as the file lists them, ne0 (the row's length) first
    type: str  # ggml's name for it: F32, Q8_0, I32, ...


@dataclass
class Header:
    """What the walk found: each key's type (`string`, `uint32`, `array[string]`, ...) and
    each tensor, in the file's order."""
    version: int
    types: dict[str, str] = field(default_factory=dict)
    tensors: list[Tensor] = field(default_factory=list)


def read_header(path: Path) -> Header:
    """The header of the GGUF file at `path`, every count and length in it checked against
    the file's size; refused in one line (file, key or tensor, what was expected)."""
    where = display_path(path)
    needs_package("gguf", where)  # its ggml type table
    size = path.stat().st_size
    if size < 4 + 4 + 8 + 8:
        raise GGUFError(f"{where}: not a readable GGUF file: {size} bytes, too short for a header")
    with path.open("rb") as handle, mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ) as data:
        return _Walk(data, where).header()


class _Walk:
    """A cursor over the mapped file that reads nothing it has not checked fits."""

    def __init__(self, data: mmap.mmap, where: str) -> None:
        self.data, self.where, self.at, self.order = data, where, 0, "<"
        self.elements, self.names = 0, set[str]()

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

    def header(self) -> Header:
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
        header = Header(version)
        alignment = DEFAULT_ALIGNMENT
        for _ in range(keys):
            key = self.string(f"metadata key {len(header.types)}'s name")
            if key in header.types:
                raise self.fail(f"{key} is set twice")
            header.types[key], value = self.value(key)
            if key == "general.alignment":
                if header.types[key] != "uint32" or value <= 0 or value & (value - 1):
                    raise self.fail(f"general.alignment={value!r} ({header.types[key]}): "
                                    "expected a power of two as uint32")
                alignment = value
        placed = [self.tensor_info(len(header.tensors) + i, header) for i in range(tensors)]
        start = -(-self.at // alignment) * alignment  # the data section's first byte
        for tensor, (offset, nbytes) in zip(header.tensors, placed, strict=True):
            if offset % alignment:
                raise self.fail(f"tensor {tensor.name}: offset {offset:,} is not a multiple of "
                                f"the alignment {alignment}")
            if start + offset + nbytes > len(self.data):
                raise self.fail(f"tensor {tensor.name}: {tensor.type} {list(tensor.dims)} needs "
                                f"{nbytes:,} bytes at offset {start + offset:,}, but the file "
                                f"has {len(self.data):,}")
        return header

    def value(self, key: str) -> tuple[str, object]:
        """(the type's name, the value: None for an array) of the value at the cursor."""
        kind = self.number("I", f"{key}'s type")
        if kind == STRING:
            return "string", self.string(key)
        if kind in SCALARS:
            code, name = SCALARS[kind]
            return name, self.number(code, key)
        if kind != ARRAY:
            raise self.fail(f"{key} has value type {kind}, which GGUF does not define")
        inner = self.number("I", f"{key}'s element type")
        length = self.number("Q", f"{key}'s length")
        if inner != STRING and inner not in SCALARS:
            raise self.fail(f"{key} is an array of type {inner}: expected numbers or strings")
        left = len(self.data) - self.at
        if inner == STRING and length * 8 > left:  # each a length and its bytes
            raise self.fail(f"{key} claims {length:,} strings, but the {left:,} bytes left "
                            f"hold at most {left // 8:,}")
        name = "string" if inner == STRING else SCALARS[inner][1]
        if inner != STRING:
            self.take(length * struct.calcsize(SCALARS[inner][0]), f"{key} ({length:,} {name})")
        self.elements += length
        if self.elements > MAX_ELEMENTS:
            raise self.fail(f"{key} has {length:,} elements: more than the {MAX_ELEMENTS:,} "
                            "array elements the zoo reads from one file")
        for index in range(length if inner == STRING else 0):
            self.string(f"{key}[{index}]")
        return f"array[{name}]", None

    def tensor_info(self, index: int, header: Header) -> tuple[int, int]:
        """Reads tensor `index`'s entry into `header`; returns (its offset, its bytes)."""
        from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType

        name = self.string(f"tensor {index}'s name")
        if name in self.names:
            raise self.fail(f"tensor {name} is listed twice")
        count = self.number("I", f"tensor {name}'s dimension count")
        if count > MAX_DIMS:
            raise self.fail(f"tensor {name} has {count:,} dimensions: ggml allows {MAX_DIMS}")
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
        elements = 1
        for dim in dims:
            elements *= dim
        self.names.add(name)
        header.tensors.append(Tensor(name, dims, kind.name))
        return offset, elements // block * block_bytes
