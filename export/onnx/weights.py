"""Where a traced graph's weights are held while the exporter rewrites it.

A model of a few hundred MB keeps its weights in the protos (InlineWeights): simplest, and
what every rewrite and quantizer reads. Past a gigabyte, each copy of the weights in memory
costs more than the machine can spare (gemma-3-1b's 4 GB were held three times over: by
PyTorch, by the traced proto and by the rewritten one), so its graphs are traced straight to
a scratch folder (DiskWeights): the protos hold only references, rewrites read the weights
through memory maps and write what they make to a spill file, and save_models copies each
tensor once into the export's data file. Steps that read weights on their own (the
quantizers, float16, the seq2seq layout) get them loaded back first (`load`).
"""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import onnx
from onnx import helper, numpy_helper

from registry.paths import display_path, inside

ALIGNMENT = 64
SPILL = "rewritten.data"  # what the rewrites make (fused projections), beside the traced data
EXTERNAL_MIN_BYTES = 1024  # smaller tensors stay inline
# Integer tensors are shape arguments (Split's widths, Reshape's shape) that onnx.checker's
# shape inference must read from the graph: a mixture of 64 experts fuses its router and 128
# projections into one MatMul whose Split takes 129 widths (1,032 bytes), which the checker
# cannot parse from external data. Such tensors stay inline up to this size.
INLINE_INTEGER_BYTES = 1 << 20
INTEGER_TYPES = (onnx.TensorProto.INT64, onnx.TensorProto.INT32)


def stays_inline(tensor: onnx.TensorProto, size: int) -> bool:
    return size < EXTERNAL_MIN_BYTES or (
        tensor.data_type in INTEGER_TYPES and size < INLINE_INTEGER_BYTES)


def external_fields(tensor: onnx.TensorProto) -> dict[str, str]:
    """An external tensor's `location`, `offset` and `length`, as its proto lists them."""
    return {entry.key: entry.value for entry in tensor.external_data}


def on_disk(tensor: onnx.TensorProto) -> bool:
    return tensor.data_location == onnx.TensorProto.EXTERNAL


class InlineWeights:
    """Weights inside the protos, as torch.onnx's `model_proto` gives them."""

    on_disk = False

    def traced(self, program: object, file_name: str) -> onnx.ModelProto:
        return program.model_proto  # type: ignore[attr-defined]

    def values(self, tensor: onnx.TensorProto) -> np.ndarray:
        return numpy_helper.to_array(tensor)

    def raw(self, tensor: onnx.TensorProto) -> bytes | memoryview:
        return numpy_helper.to_array(tensor).tobytes()

    def add(self, array: np.ndarray, name: str) -> onnx.TensorProto:
        return numpy_helper.from_array(array, name)

    def inline(self, tensor: onnx.TensorProto) -> None:
        """Nothing to do: the tensor's bytes are in the proto."""

    def load(self, model: onnx.ModelProto) -> None:
        """Nothing to load: the weights are in the proto."""

    def close(self) -> None:
        """Nothing to remove."""


class DiskWeights(InlineWeights):
    """Weights in files under `folder`: external tensors' locations are relative to it."""

    on_disk = True

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.traces = 0  # each trace's files under a name of its own
        folder.mkdir(parents=True, exist_ok=True)

    def traced(self, program: object, file_name: str) -> onnx.ModelProto:
        """The graph saved by torch.onnx with its weights in a file of their own (written one
        tensor at a time from PyTorch's memory), then read back without them."""
        self.traces += 1
        path = self.folder / f"{self.traces}-{file_name}"
        program.save(str(path), external_data=True)  # type: ignore[attr-defined]
        model = onnx.load(str(path), load_external_data=False)
        path.unlink()  # its data file stays, beside it: the locations are relative to folder
        for tensor in model.graph.initializer:
            # small tensors back in the proto: shape arguments any step may read from it
            if on_disk(tensor) and stays_inline(tensor, int(external_fields(tensor)["length"])):
                self.inline(tensor)
        return model

    def view(self, tensor: onnx.TensorProto) -> np.ndarray:
        """A read-only memory map of an external tensor's bytes (uint8): its own, so that the
        pages it touched leave the process's memory with it (one map of the whole file would
        keep every page read until the end: gemma-3-1b's export peaked 0.8 GiB higher). Its
        callers hold few at once (forms.py reads one group's weights at a time)."""
        where = external_fields(tensor)
        path = inside(self.folder, where["location"], display_path(self.folder), "location")
        offset = int(where.get("offset", 0))
        return np.memmap(path, np.uint8, "r", offset, (int(where["length"]),))

    def values(self, tensor: onnx.TensorProto) -> np.ndarray:
        if not on_disk(tensor):
            return numpy_helper.to_array(tensor)
        dtype = helper.tensor_dtype_to_np_dtype(tensor.data_type)
        return self.view(tensor).view(dtype).reshape(tuple(tensor.dims))

    def raw(self, tensor: onnx.TensorProto) -> bytes | memoryview:
        return memoryview(self.view(tensor)) if on_disk(tensor) else super().raw(tensor)

    def add(self, array: np.ndarray, name: str) -> onnx.TensorProto:
        """`array` appended to the spill file; the tensor refers to it."""
        tensor = onnx.TensorProto(name=name, dims=array.shape,
                                  data_type=helper.np_dtype_to_tensor_dtype(array.dtype))
        with (self.folder / SPILL).open("ab") as stream:
            stream.write(b"\0" * (-stream.tell() % ALIGNMENT))
            offset = stream.tell()
            stream.write(np.ascontiguousarray(array).tobytes())
        refer(tensor, SPILL, offset, array.nbytes)
        return tensor

    def load(self, model: onnx.ModelProto) -> None:
        """Every external tensor's bytes back into the proto (for steps that read them)."""
        for tensor in model.graph.initializer:
            self.inline(tensor)

    def inline(self, tensor: onnx.TensorProto) -> None:
        if not on_disk(tensor):
            return
        data = self.view(tensor).tobytes()
        del tensor.external_data[:]
        tensor.ClearField("data_location")  # unset, as in a proto that never left memory
        tensor.raw_data = data

    def close(self) -> None:
        shutil.rmtree(self.folder, ignore_errors=True)


def refer(tensor: onnx.TensorProto, location: str, offset: int, length: int) -> None:
    """Make `tensor` an external one at `location`, its bytes at [offset, offset + length)."""
    tensor.ClearField("raw_data")
    del tensor.float_data[:]
    del tensor.int64_data[:]
    tensor.data_location = onnx.TensorProto.EXTERNAL
    del tensor.external_data[:]
    for key, value in (("location", location), ("offset", str(offset)),
                       ("length", str(length))):
        entry = tensor.external_data.add()
        entry.key, entry.value = key, value


INLINE = InlineWeights()
