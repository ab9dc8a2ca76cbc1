"""A Triton Inference Server model repository (ONNX Runtime backend) made from an export folder.

One Triton model per contract graph: `NAME` for a one-graph export, `NAME-encoder` and
`NAME-decoder` for the encoder-decoder. Each config.pbtxt is generated from the ONNX graph's own
inputs and outputs (name, dtype, dims), so it cannot drift from the file it describes:

- `max_batch_size > 0` and every tensor's first axis is the batch: Triton's dims leave it out.
  Dynamic axes (sequence, past, ...) are -1.
- A graph without a cache (an encoder) gets dynamic batching: Triton joins requests of equal
  shapes into one run. A graph with a cache (a decoder step) is served stateless: the cache
  tensors are ordinary inputs and outputs that the client feeds back each step, so requests
  are not batched by the server (their past lengths differ) - the client batches its own rows.
- The shared-cache graph (model_kv.onnx, model_genai.onnx) is left out: it needs its outputs
  bound to its inputs' buffers, which Triton's stateless calls cannot do.
- A graph with external data becomes a folder named model.onnx holding model.onnx and the data
  file, the layout the ONNX Runtime backend loads.
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path

import onnx

from export.onnx.files import external_data_files
from registry.catalog import Card
from registry.errors import ZooError
from registry.options import option
from runtime.contract import CACHE_INPUT
from runtime.files.atomic import atomic_folder
from runtime.manifest import manifest_card, read_manifest

CONFIG = "config.pbtxt"
MODEL_FILE = "model.onnx"  # the ONNX Runtime backend's default_model_filename
VERSION = "1"
BATCH_AXIS = "batch_size"
KINDS = ("cpu", "gpu")  # the instance group's KIND_CPU / KIND_GPU
DTYPES = {  # ONNX element type -> Triton data type
    onnx.TensorProto.FLOAT: "TYPE_FP32", onnx.TensorProto.FLOAT16: "TYPE_FP16",
    onnx.TensorProto.BFLOAT16: "TYPE_BF16", onnx.TensorProto.DOUBLE: "TYPE_FP64",
    onnx.TensorProto.INT64: "TYPE_INT64", onnx.TensorProto.INT32: "TYPE_INT32",
    onnx.TensorProto.INT8: "TYPE_INT8", onnx.TensorProto.UINT8: "TYPE_UINT8",
    onnx.TensorProto.BOOL: "TYPE_BOOL",
}


class TritonError(ZooError):
    """A model repository that cannot be made (bad options, a graph Triton cannot describe)."""


@dataclass(frozen=True)
class TritonOptions:
    max_batch_size: int = option(8)
    preferred_batch_sizes: tuple[int, ...] = (4, 8)
    queue_delay_us: int = option(100, "Dynamic batching: how long a request may wait for "
                                 "others (encoders).")
    kind: str = option("cpu", "Where Triton runs the instances (KIND_CPU / KIND_GPU).",
                       choices=KINDS)
    instances: int = option(1, "Instances per model.")

    def check(self) -> None:
        if self.max_batch_size < 1:
            raise TritonError(f"--max-batch-size {self.max_batch_size}: should be >= 1")
        if self.instances < 1:
            raise TritonError(f"--instances {self.instances}: should be >= 1")
        if self.kind not in KINDS:
            raise TritonError(f"--kind {self.kind!r}: should be {' or '.join(KINDS)}")
        if self.queue_delay_us < 0:
            raise TritonError(f"--queue-delay-us {self.queue_delay_us}: should be >= 0")


@dataclass(frozen=True)
class Tensor:
    name: str
    data_type: str
    dims: tuple[int, ...]  # without the batch axis; -1 where dynamic


def model_names(card: Card, files: list[str]) -> dict[str, str]:
    """{graph file: Triton model name}."""
    if len(files) == 1:
        return {files[0]: card.name}
    return {file: f"{card.name}-{Path(file).stem}" for file in files}


def write_repository(export: Path, repository: Path, options: TritonOptions | None = None,
                     force: bool = False) -> dict[str, Path]:
    """Write the model repository for `export`; {Triton model name: its folder}."""
    options = options or TritonOptions()
    options.check()
    export = Path(export)
    manifest = read_manifest(export)  # checks every file's sha256 first
    card = manifest_card(export, manifest)
    names = model_names(card, list(manifest["graphs"]))
    written = {}
    with atomic_folder(Path(repository), force) as staging:
        for file, name in names.items():
            proto = onnx.load(str(export / file), load_external_data=False)
            stateless_step = takes_cache(proto)
            folder = staging / name
            (folder / VERSION).mkdir(parents=True)
            _place_graph(export / file, proto, folder / VERSION)
            (folder / CONFIG).write_text(model_config(name, proto, options, stateless_step),
                                         encoding="utf-8")
            written[name] = Path(repository) / name
    return written


def takes_cache(proto: onnx.ModelProto) -> bool:
    """A decoding step: the graph takes a key/value cache, which the client feeds back."""
    return any(value.name.startswith(f"{CACHE_INPUT}.") for value in proto.graph.input)


def _place_graph(source: Path, proto: onnx.ModelProto, version: Path) -> None:
    data = external_data_files(source, proto)
    if not data:
        _copy(source, version / MODEL_FILE)
        return
    folder = version / MODEL_FILE  # a folder named model.onnx holding model.onnx and the data
    folder.mkdir()
    _copy(source, folder / MODEL_FILE)
    for location, path in data.items():  # relative to the graph, as onnx writes it
        _copy(path, folder / location)


def _copy(source: Path, target: Path) -> None:
    """A copy, never a hard link: onnx.checker refuses external data with more than one link
    ("a potential hardlink attack"), so a linked repository would leave the export itself
    failing the checker."""
    target.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(source, target)


def tensors(values: list[onnx.ValueInfoProto], batched: bool, file: str) -> list[Tensor]:
    found = []
    for value in values:
        tensor = value.type.tensor_type
        data_type = DTYPES.get(tensor.elem_type)
        if data_type is None:
            raise TritonError(f"{file}: {value.name} has ONNX type "
                              f"{onnx.TensorProto.DataType.Name(tensor.elem_type)}, which "
                              "Triton's ONNX Runtime backend is not given here")
        dims = [d.dim_value if d.HasField("dim_value") else -1 for d in tensor.shape.dim]
        if batched:
            first = tensor.shape.dim[0] if tensor.shape.dim else None
            if first is None or first.dim_param != BATCH_AXIS:
                raise TritonError(f"{file}: {value.name} has no leading '{BATCH_AXIS}' axis")
            dims = dims[1:]
        found.append(Tensor(value.name, data_type, tuple(dims)))
    return found


def model_config(name: str, proto: onnx.ModelProto, options: TritonOptions,
                 stateless_step: bool) -> str:
    """config.pbtxt (protobuf text format of Triton's ModelConfig) for one graph."""
    file = f"{name}/{VERSION}/{MODEL_FILE}"
    initializers = {i.name for i in proto.graph.initializer}
    inputs = tensors([i for i in proto.graph.input if i.name not in initializers], True, file)
    outputs = tensors(list(proto.graph.output), True, file)
    lines = [f'name: "{name}"', 'backend: "onnxruntime"',
             f"max_batch_size: {options.max_batch_size}"]
    lines += _block("input", inputs) + _block("output", outputs)
    if not stateless_step:
        preferred = [size for size in options.preferred_batch_sizes
                     if size <= options.max_batch_size] or [options.max_batch_size]
        lines += ["dynamic_batching {",
                  f"  preferred_batch_size: [ {', '.join(map(str, preferred))} ]",
                  f"  max_queue_delay_microseconds: {options.queue_delay_us}", "}"]
    lines += ["instance_group [", "  {", f"    count: {options.instances}",
              f"    kind: KIND_{options.kind.upper()}", "  }", "]"]
    return "\n".join(lines) + "\n"


def _block(kind: str, entries: list[Tensor]) -> list[str]:
    lines = [f"{kind} ["]
    for position, tensor in enumerate(entries):
        dims = ", ".join(str(d) for d in tensor.dims)
        lines += ["  {", f'    name: "{tensor.name}"', f"    data_type: {tensor.data_type}",
                  f"    dims: [ {dims} ]", "  }" + ("," if position < len(entries) - 1 else "")]
    return lines + ["]"]
