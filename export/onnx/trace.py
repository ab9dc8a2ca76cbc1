"""One torch.onnx (dynamo) export of one graph, with example inputs and dynamic shapes made
from the family's GraphIO, so names, axes and examples cannot drift apart."""

from __future__ import annotations

import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import onnx
import torch
from torch import nn
from torch.export import Dim

from export.family import GraphIO
from export.logs import quiet_loggers
from export.onnx.forms import fast_forms
from export.onnx.weights import INLINE, InlineWeights
from registry.catalog import Card
from registry.dual import image_tower
from registry.errors import ZooError, first_line
from registry.schema import target_vocab_size
from registry.sizes import attention_sizes
from registry.stems import is_mel_card

DEFAULT_OPSET = MIN_OPSET = 18
MAX_OPSET = 25
# torch.export specialises any dimension whose example size is 0 or 1: trace with >= 2 everywhere.
# The axes carry the names Optimum's exports give them (transformers.js sizes an empty cache from
# the graph's own input shapes and resolves only `batch_size`).
TRACE_SIZES = {"batch_size": 2, "sequence_length": 3, "past_sequence_length": 4,
               "encoder_sequence_length": 5}
TRACE_SIZES["encoder_frames"] = 2 * TRACE_SIZES["encoder_sequence_length"]  # Whisper's input
TRACE_SIZES["total_sequence_length"] = (TRACE_SIZES["past_sequence_length"]
                                        + TRACE_SIZES["sequence_length"])
# a dual encoder's joint graph batches its texts and its images apart
TRACE_SIZES.update(text_batch_size=2, image_batch_size=3)


class ExportError(ZooError):
    """The exporter or onnx.checker refused the model."""


def check_opset(opset: int) -> None:
    """torch.onnx's exporter emits opset 18 and newer. 25 is the newest that it converted and
    ONNX Runtime 1.31 ran here (26 and later fail inside the exporter's version converter)."""
    if not MIN_OPSET <= opset <= MAX_OPSET:
        raise ExportError(f"--opset {opset}: supported opsets are {MIN_OPSET} to {MAX_OPSET}")


def _sizes(card: Card) -> dict[str, int]:
    sizes = attention_sizes(card)
    tower = image_tower(card)  # a ViT's card, or a dual encoder's vision card
    image = ({"num_channels": tower["channels"], "height": tower["image_size"],
              "width": tower["image_size"]} if tower is not None else {})
    audio = {"feature_size": card["n_mels"]} if is_mel_card(card) else {}
    return {**TRACE_SIZES, "kv_heads": sizes.kv_heads, "head_dim": sizes.head_dim,
            "d_model": card["d_model"], **image, **audio}


def _example(kind: str, shape: tuple[int, ...], card: Card) -> torch.Tensor:
    if kind == "ids":
        return torch.randint(3, card["vocab_size"], shape)
    if kind == "target_ids":  # the encoder-decoder's target side
        return torch.randint(3, target_vocab_size(card), shape)
    if kind == "ones":
        return torch.ones(shape, dtype=torch.long)
    if kind == "zeros":
        return torch.zeros(shape, dtype=torch.long)
    if kind == "positions":  # the new tokens follow the traced past
        start = TRACE_SIZES["past_sequence_length"]
        return torch.arange(start, start + shape[-1]).expand(shape).contiguous()
    return torch.randn(shape)


def trace_inputs(io: GraphIO, card: Card) -> tuple[tuple, tuple]:
    """(example args, dynamic shapes), the cache as one tuple, mirrored in the shapes."""
    sizes = _sizes(card)
    dims = {name: Dim(name) for name in TRACE_SIZES}

    def shape_of(axes: tuple[str, ...]) -> tuple[tuple[int, ...], dict[int, Dim]]:
        return (tuple(sizes[a] for a in axes),
                {index: dims[a] for index, a in enumerate(axes) if a in dims})

    args, shapes = [], []
    for spec in io.inputs:
        shape, dynamic = shape_of(spec.axes)
        args.append(_example(spec.example, shape, card))
        shapes.append(dynamic)
    per_layer = [shape_of(axes) for axes in io.cache_inputs() for _ in ("key", "value")]
    if per_layer:
        layers = range(card["n_layers"])
        args.append(tuple(torch.randn(shape) for _ in layers for shape, _ in per_layer))
        shapes.append(tuple(dynamic for _ in layers for _, dynamic in per_layer))
    return tuple(args), tuple(shapes)


_REGISTRIES: dict[tuple, Any] = {}


@contextmanager
def registry_built_once() -> Iterator[None]:
    """torch.onnx rebuilds its table of ONNX functions on every export (about 2 s of a tiny
    decoder's 10 s here: it parses every torchlib function's source again). It only reads the table
    unless given a custom translation table, which the zoo never passes, so within our exports
    one table per opset serves them all. torch's own method is back in place afterwards, and a
    torch without this private seam simply builds the table each time."""
    try:
        from torch.onnx._internal.exporter._registration import ONNXRegistry
    except ImportError:
        yield
        return
    build = ONNXRegistry.__dict__.get("from_torchlib")
    if not isinstance(build, classmethod):
        yield
        return

    def built_once(cls: type, *args: Any, **kwargs: Any) -> Any:
        key = (args, tuple(sorted(kwargs.items())))  # the opset, however it is passed
        if key not in _REGISTRIES:
            _REGISTRIES[key] = build.__func__(cls, *args, **kwargs)
        return _REGISTRIES[key]

    ONNXRegistry.from_torchlib = classmethod(built_once)
    try:
        yield
    finally:
        ONNXRegistry.from_torchlib = build


def export_graph(graph: nn.Module, args: tuple, shapes: tuple, names: tuple[list, list],
                 opset: int, path: Path, weights: InlineWeights = INLINE) -> onnx.ModelProto:
    """The ONNX proto of `graph` traced on `args`, in the forms ONNX Runtime runs fastest
    (export/onnx/forms.py), its weights where `weights` keeps them; a failure is one
    ExportError line."""
    with warnings.catch_warnings(), quiet_loggers("torch.onnx", "onnxscript", "torch.export"), \
            torch.no_grad(), registry_built_once():
        warnings.simplefilter("ignore")  # the exporter's own chatter; failures still raise
        try:
            program = torch.onnx.export(
                graph, args, dynamic_shapes=shapes, input_names=names[0],
                output_names=names[1], opset_version=opset, dynamo=True, verbose=False,
            )
            model = weights.traced(program, path.name)
        except Exception as exc:  # the exporter raises many types; report one line
            raise ExportError(f"{path.name}: torch.onnx.export failed: {first_line(exc)}") from exc
    return fast_forms(model, weights)
