"""Writing ONNX protos: strip the exporter's debug annotations, add our metadata, and store each
weight once, even when two graphs (encoder.onnx and decoder.onnx) share it."""

from __future__ import annotations

import hashlib
from pathlib import Path

import onnx
from google.protobuf.message import EncodeError
from onnx.external_data_helper import convert_model_to_external_data, write_external_data_tensors

from export.onnx.weights import (
    ALIGNMENT,
    EXTERNAL_MIN_BYTES,
    INLINE,
    InlineWeights,
    external_fields,
    on_disk,
    refer,
    stays_inline,
)
from registry.errors import ZooError
from registry.paths import display_path, inside

SHARED_DATA = "weights.onnx.data"
PROTO_LIMIT = 1_800_000_000  # protobuf cannot serialise 2 GB; stay clear of it


def too_large(model: onnx.ModelProto) -> bool:
    """Past what one protobuf holds, counting the weights still on disk (export/onnx/
    weights.py): protobuf cannot even count a message past 2 GB (ByteSize raises EncodeError,
    as it did for gemma-3-1b's 4 GB of weights)."""
    try:
        size = model.ByteSize()
    except EncodeError:
        return True
    on_file = (int(external_fields(tensor).get("length", 0))
               for tensor in model.graph.initializer if on_disk(tensor))
    return size + sum(on_file) > PROTO_LIMIT


def strip_debug(model: onnx.ModelProto) -> None:
    """Drop per-node stack traces and FX names: they would make the file ~25% larger."""
    for node in model.graph.node:
        del node.metadata_props[:]
        node.doc_string = ""


def set_metadata(model: onnx.ModelProto, metadata: dict[str, str]) -> None:
    for key, value in metadata.items():
        entry = model.metadata_props.add()
        entry.key, entry.value = key, value


def data_file_name(graph: str) -> str:
    """A lone graph's external data file, named as transformers.js fetches it (its
    `use_external_data_format`): `model.onnx` -> `model.onnx_data`."""
    return f"{Path(graph).name}_data"


def _externalise(models: dict[str, onnx.ModelProto], folder: Path, data_name: str,
                 weights: InlineWeights) -> None:
    """Move large initializers into one file beside the graphs (which share one folder: its
    location is relative to each), each distinct tensor written once, from the proto or from
    the scratch file it was traced to."""
    parents = {Path(name).parent for name in models}
    if len(parents) != 1:
        raise ZooError(f"graphs {sorted(models)} should share one folder for {data_name}")
    data_path = folder / parents.pop() / data_name
    written: dict[str, tuple[int, int]] = {}
    with data_path.open("wb") as stream:
        for model in models.values():
            for tensor in model.graph.initializer:
                raw = weights.raw(tensor)
                if stays_inline(tensor, len(raw)):
                    weights.inline(tensor)
                    continue
                # by bytes, not shape: --quantize gguf's tied head (MatMulNBits' B) and
                # embedding (GatherBlockQuantized's data) view one block array two ways
                key = f"{tensor.data_type}:{hashlib.sha256(raw).hexdigest()}"
                if key not in written:
                    stream.write(b"\0" * (-stream.tell() % ALIGNMENT))
                    written[key] = (stream.tell(), len(raw))
                    stream.write(raw)
                refer(tensor, data_path.name, *written[key])


def save_models(models: dict[str, onnx.ModelProto], folder: Path,
                weights: InlineWeights = INLINE) -> None:
    """One graph that fits in a protobuf is saved whole (simplest for any runtime), one too
    large with its weights in `NAME.onnx_data`; several graphs share `weights.onnx.data`."""
    for name in models:
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
    if len(models) > 1:
        _externalise(models, folder, SHARED_DATA, weights)
    elif any(too_large(model) for model in models.values()):
        _externalise(models, folder, data_file_name(next(iter(models))), weights)
    else:
        for model in models.values():
            weights.load(model)
    for name, model in models.items():
        onnx.save_model(model, str(folder / name))


def save_standalone(models: dict[str, onnx.ModelProto], folder: Path) -> None:
    """Graphs that share no file with the others (the Hugging Face clients' seq2seq layout:
    transformers.js names an external data file after its graph, `NAME.onnx_data`, and fetches
    no other): weights inline, or for a graph too large for a protobuf in `NAME.onnx_data`."""
    for name, model in models.items():
        path = folder / name
        path.parent.mkdir(parents=True, exist_ok=True)
        if too_large(model):
            convert_model_to_external_data(model, all_tensors_to_one_file=True,
                                           location=data_file_name(name),
                                           size_threshold=EXTERNAL_MIN_BYTES)
            for tensor in model.graph.initializer:
                if stays_inline(tensor, len(tensor.raw_data)):
                    tensor.data_location = onnx.TensorProto.DEFAULT
                    del tensor.external_data[:]
            model = write_external_data_tensors(model, str(path.parent))
        onnx.save_model(model, str(path))


def external_data_files(graph: Path, proto: onnx.ModelProto) -> dict[str, Path]:
    """{location: path} of the files `proto`'s external tensors live in, each refused in one
    line unless it stays in the graph's folder (the location is the file's to say, and a hostile
    one would have a command link or copy a file from anywhere)."""
    where = display_path(graph)
    locations = sorted({location for tensor in proto.graph.initializer if on_disk(tensor)
                        if (location := external_fields(tensor).get("location")) is not None})
    found = {}
    for location in locations:
        path = inside(graph.parent, location, where, "external data location")
        if not path.is_file():
            raise ZooError(f"{where}: external data location {location!r}: no such file")
        found[location] = path
    return found
