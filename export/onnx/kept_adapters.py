"""`zoo export --adapters keep`: the base traced once with each adapted linear's LoRA factors as
graph inputs, and the adapter written apart in ONNX Runtime's adapter format.

Each LoRALinear (zoo/blocks/lora.py) computes W x + (x A) B with A (batch, in, rank) and
B (batch, rank, out) the graph's inputs `{module}.lora_A` / `.lora_B` (runtime/contract.py),
the scale folded into B. Zeros give the base exactly; a smaller rank padded with zeros is
exact; each row carries its own factors (`zoo serve` mixes adapters in a batch). The leading
axis is traced as the batch itself: the exporter may read the batch size from any input that
has it (SmolLM2's value projection was reshaped by an adapter input's), so it must be the
batch's, and an adapter file's tensors (leading axis 1) serve a batch of one as they are and
larger batches repeated (runtime/adapters.py). The inputs also carry zero defaults
(initializers of the same name, ONNX's overridable inputs), so a client that feeds no adapter
to a batch of one runs the base.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
import torch
from onnx import numpy_helper
from torch import nn
from torch.export import Dim

from registry.catalog import Card
from registry.errors import ZooError
from registry.families import spec_of
from registry.paths import display_path
from runtime.contract import ADAPTER_RANK, adapter_file, lora_inputs
from zoo.blocks.lora import LoRALinear, adapters

TRACE_RANK = 2  # torch.export specialises a size-1 axis: the rank traced at 2, dynamic
BATCH_AXIS = "batch_size"  # the family's own batch axis (export/onnx/trace.py's name)
UNSAFE = re.compile(r"[^A-Za-z0-9_.-]+")


@dataclass(frozen=True)
class KeptLinear:
    """One adapted linear of the export: its module name and sizes."""

    module: str
    in_features: int
    out_features: int

    def as_dict(self) -> dict[str, Any]:
        a, b = lora_inputs(self.module)
        return {"lora_A": a, "lora_B": b, "in": self.in_features, "out": self.out_features}


def kept_linears(model: nn.Module) -> list[KeptLinear]:
    return [KeptLinear(name, layer.in_features, layer.out_features)
            for name, layer in adapters(model).items()]


def check_keep(model: nn.Module, card: Card, source: str) -> None:
    """Refuse, before any tracing, what --adapters keep cannot export: a source without an
    adapter, or a family whose graphs it does not feed."""
    if spec_of(card).cross_attention:
        raise ZooError(f"{card.name}: --adapters keep: encoder-decoder exports are not "
                       "supported (two graphs and a cross-attention cache; use --adapters "
                       "merge)")
    if not adapters(model):
        raise ZooError(f"{source}: --adapters keep: no LoRA adapter in this folder "
                       "(adapter_config.json, from `zoo train --lora` or `zoo import "
                       "--adapter`)")


def adapter_name(source: Path) -> str:
    """The adapter's name in the export: its folder's, in letters, digits, `.`, `_`, `-`."""
    return UNSAFE.sub("-", source.resolve().name).strip("-.") or "adapter"


def input_names(kept: list[KeptLinear]) -> list[str]:
    return [name for linear in kept for name in lora_inputs(linear.module)]


def with_adapter_inputs(names: list[str], at: int, kept: list[KeptLinear]) -> list[str]:
    """A graph's input names with the adapters' after its own `at` inputs, before the cache."""
    return [*names[:at], *input_names(kept), *names[at:]]


class AdapterInputs(nn.Module):
    """A family's flat-signature wrapper taking the factors of every kept linear as one tuple
    argument at position `at`; each LoRALinear computes with them while the graph runs."""

    def __init__(self, graph: nn.Module, model: nn.Module, at: int) -> None:
        super().__init__()
        self.inner = graph  # not `graph`: the name of an FX GraphModule's own attribute
        self.layers: list[LoRALinear] = list(adapters(model).values())  # the graph's own
        self.at = at

    def forward(self, *args: Any) -> Any:
        factors = args[self.at]
        for index, layer in enumerate(self.layers):
            layer.fed = (factors[2 * index], factors[2 * index + 1])
        try:
            return self.inner(*args[:self.at], *args[self.at + 1:])
        finally:
            for layer in self.layers:
                layer.fed = None


def traced_with_adapters(graph: nn.Module, model: nn.Module, at: int, args: tuple,
                         shapes: tuple, kept: list[KeptLinear]
                         ) -> tuple[nn.Module, tuple, tuple]:
    """(wrapper, example args, dynamic shapes) with the factors inserted at `at`."""
    batch, rank = Dim(BATCH_AXIS), Dim(ADAPTER_RANK)
    batch_size = args[0].shape[0]
    factors, factor_shapes = [], []
    for linear in kept:
        factors += [torch.randn(batch_size, linear.in_features, TRACE_RANK) * 0.1,
                    torch.randn(batch_size, TRACE_RANK, linear.out_features) * 0.1]
        factor_shapes += [{0: batch, 2: rank}, {0: batch, 1: rank}]
    return (AdapterInputs(graph, model, at), (*args[:at], tuple(factors), *args[at:]),
            ((*shapes[:at], tuple(factor_shapes), *shapes[at:]),))  # forward(*args): one


def adapter_parameters(model: nn.Module) -> dict[str, np.ndarray]:
    """The graph inputs' values for `model`'s adapters: A^T (1, in, r), (s B)^T (1, r, out)."""
    parameters = {}
    for name, layer in adapters(model).items():
        a, b = lora_inputs(name)
        with torch.no_grad():
            parameters[a] = layer.lora_A.weight.float().T.contiguous()[None].numpy()
            parameters[b] = (layer.lora_B.weight.float() * layer.scaling).T.contiguous()[
                None].numpy()
    return parameters


def write_adapter_file(parameters: dict[str, np.ndarray], path: Path) -> None:
    """ONNX Runtime's adapter file (`LoraAdapter.Load`, `RunOptions.add_active_adapter`, and
    GenAI's `Adapters.load` read it)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    arrays = {name: np.ascontiguousarray(value, np.float32) for name, value in
              parameters.items()}  # alive until written: the OrtValues point into them
    adapter = ort.AdapterFormat()
    adapter.set_parameters({name: ort.OrtValue.ortvalue_from_numpy(value)
                            for name, value in arrays.items()})
    try:
        adapter.export_adapter(str(path))
    except Exception as exc:  # ORT raises its own types; one line
        raise ZooError(f"{display_path(path)}: ONNX Runtime could not write the adapter: "
                       f"{exc}") from exc


def with_zero_defaults(proto: onnx.ModelProto, kept: list[KeptLinear]) -> None:
    """Each adapter input: a zero default (batch 1, rank 1), so that a run of one row that
    feeds no adapter computes the base."""
    sizes = {}
    for linear in kept:
        a, b = lora_inputs(linear.module)
        sizes[a], sizes[b] = (1, linear.in_features, 1), (1, 1, linear.out_features)
    for graph_input in proto.graph.input:
        if graph_input.name in sizes:
            proto.graph.initializer.append(numpy_helper.from_array(
                np.zeros(sizes[graph_input.name], np.float32), graph_input.name))


def manifest_entry(kept: list[KeptLinear], name: str) -> dict[str, Any]:
    return {
        "linears": [linear.as_dict() for linear in kept],
        "shapes": "lora_A (batch, in, rank), lora_B (batch, rank, out), a row's factors "
                  "each; the scale folded into lora_B; zeros are the base (the inputs' "
                  "defaults, for one row)",
        "files": {name: adapter_file(name)},
    }
