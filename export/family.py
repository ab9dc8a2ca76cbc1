"""What a family is to the exporter: one object per family, dispatched by the table in
export/families/__init__.py. What the family is as data (stacks, generates, poolings) is its
torch-free spec (registry/families.py, `family.spec`); what `zoo bench` and `zoo attention` do
per family is registered against that spec (export/bench/families.py, export/inspect/maps.py).

The graphs a family writes are data (GraphIO: inputs with their axes, outputs, the cache); the
rest are small methods that hand the family's export pieces (wrappers, parity cases, agreement
and quality checks, optimize extras, the clients' layouts, GenAI's files) to the generic code
that drives them. A family overrides what differs.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import onnx
from torch import nn

from export.onnx.wrappers import Wrapper
from registry.catalog import Card
from registry.errors import ZooError
from registry.families import FamilySpec
from registry.sizes import CACHE_AXES, CROSS_CACHE_AXES
from runtime.contract import CACHE_INPUT, CACHE_OUTPUT, ENCODER, past_names


@dataclass(frozen=True)
class Input:
    """One graph input. `axes` names each axis's size: dynamic ones (batch, sequence,
    past_sequence, total_sequence, encoder_sequence) become symbolic dimensions; the others
    (d_model, kv_heads, head_dim) are the card's, from registry/sizes.py. `example` says how
    to make a tracing value."""

    name: str
    axes: tuple[str, ...]
    example: str  # ids | target_ids | ones | zeros | positions | normal
    when: str | None = None  # the card field that must be set for the input to exist




@dataclass(frozen=True)
class GraphIO:
    """One ONNX file: its inputs (the cache last, one key and one value per layer), outputs,
    the wrapper that gives the model this flat signature, and the attention groups whose maps
    `--attentions` adds as outputs (`{group}.{layer}`, after every other output).

    The encoder-decoder's cross-attention cache (`cross_cache`) is computed once per source:
    "out": the graph returns it (`present.{i}.encoder.*`, after the other outputs); "in": the
    graph takes it (`past_key_values.{i}.encoder.*`, after each layer's self cache, in
    Optimum's order) and does not hand it back."""

    inputs: tuple[Input, ...]
    outputs: tuple[str, ...]
    wrapper: type[Wrapper]
    cache_infix: str | None = None  # None: no cache; "" or ".decoder": the names' infix
    attention_groups: tuple[str, ...] = ()
    cross_cache: str | None = None  # None, "out" or "in"

    def cache_inputs(self) -> list[tuple[str, ...]]:
        """Per layer, the axes of each cache input in order (key and value alike)."""
        axes = [] if self.cache_infix is None else [CACHE_AXES]
        return axes + ([CROSS_CACHE_AXES] if self.cross_cache == "in" else [])

    def input_names(self, card: Card) -> list[str]:
        names = [i.name for i in self.inputs]
        if self.cache_infix is not None:
            infixes = (self.cache_infix, ENCODER) if self.cross_cache == "in" else (
                self.cache_infix,)
            names += past_names(card["n_layers"], CACHE_INPUT, *infixes)
        return names

    def output_names(self, card: Card, attentions: bool = False) -> list[str]:
        names = list(self.outputs)
        if self.cache_infix is not None:
            names += past_names(card["n_layers"], CACHE_OUTPUT, self.cache_infix)
        if self.cross_cache == "out":
            names += past_names(card["n_layers"], CACHE_OUTPUT, ENCODER)
        if attentions:
            names += attention_names(self.attention_groups, card["n_layers"])
        return names


def contract_of(graphs: dict[str, GraphIO], card: Card, attentions: bool = False
                ) -> dict[str, tuple[list[str], list[str]]]:
    """{file: (input names, output names)} of graphs already made (an export makes them once)."""
    return {file: (io.input_names(card), io.output_names(card, attentions))
            for file, io in graphs.items()}


def wrappers_of(graphs: dict[str, GraphIO], model: nn.Module, attentions: bool = False
                ) -> dict[str, nn.Module]:
    return {file: io.wrapper(model, io.attention_groups if attentions else ())
            for file, io in graphs.items()}


def attention_names(groups: tuple[str, ...], n_layers: int) -> list[str]:
    """`attentions.0`, `attentions.1`, ... per group (Hugging Face's output names)."""
    return [f"{group}.{layer}" for group in groups for layer in range(n_layers)]


@dataclass
class Case:
    """One parity case: feeds for one graph file."""

    name: str
    file: str
    feeds: dict[str, np.ndarray]


@dataclass
class Extras:
    """What `--optimize` adds for a family: more graphs and manifest entries."""

    graphs: dict[str, onnx.ModelProto] = field(default_factory=dict)
    manifest: dict[str, Any] = field(default_factory=dict)


class Family:
    """A family's spec (registry/families.py: what it is, as data) and what the exporter adds."""

    spec: FamilySpec
    optimizer_model_type: str = "bert"  # onnxruntime.transformers' pattern set
    attention_fusion_note: str = ""  # why a missing attention fusion does not matter, if so
    # --quantize int8-dynamic quantizes these graphs (compute-bound forwards); a family with
    # none refuses it, saying what to use instead
    dynamic_files: tuple[str, ...] = ()
    dynamic_alternative: str = "--quantize int8 (weight-only MatMulNBits)"
    # each graph saved whole, its weights its own (transformers.js fetches `NAME.onnx_data` for
    # a graph, never a data file several share): a dual encoder's towers and joint graph
    standalone_graphs: bool = False

    @property
    def name(self) -> str:
        return self.spec.name

    def variant(self, card: Any) -> Family:
        """The object for this card: a family whose cards differ in kind (a decoder with a
        pooling does not generate) hands out another; most hand out themselves."""
        return self

    def graphs(self, card: Card) -> dict[str, GraphIO]:
        """{file: GraphIO}, inputs that the card leaves out already dropped."""
        raise NotImplementedError

    def contract(self, card: Card, attentions: bool = False
                 ) -> dict[str, tuple[list[str], list[str]]]:
        """{file: (input names, output names)}: what manifest.json and the engines use."""
        return contract_of(self.graphs(card), card, attentions)

    def wrappers(self, model: nn.Module, card: Card, attentions: bool = False
                 ) -> dict[str, nn.Module]:
        """{file: a module with the file's flat signature}, for tracing and for PyTorch."""
        return wrappers_of(self.graphs(card), model, attentions)

    def parity_cases(self, reference: Any, rng: np.random.Generator) -> list[Case]:
        raise NotImplementedError

    def agreement(self, reference: Any, candidate: Any, steps: int, seed: int) -> Any:
        raise NotImplementedError

    def generation_check(self, reference: Any, candidate: Any, steps: int, seed: int
                         ) -> tuple[str, bool, int] | None:
        """The parity grid's greedy comparison where the family's own differs from generating
        after token ids: (what, same tokens, steps); None: the generic one, if it generates."""
        return None

    def check_quantization(self, card: Card, choice: str | None) -> None:
        """Refuse, before any tracing, a quantization this family's graphs are not made for."""
        if choice == "int8-dynamic" and not self.dynamic_files:
            raise ZooError(f"{card.name}: --quantize int8-dynamic is for encoders, embedders and "
                           f"classifiers, whose forward is compute-bound; a {self.name}'s "
                           f"generation reads its weights every step: use "
                           f"{self.dynamic_alternative}")

    def check_dtype(self, card: Card, dtype: str) -> None:
        """Refuse, before any tracing, a --dtype this family's checks cannot prove."""

    def check_optimize(self, card: Card) -> None:
        """Refuse, before any tracing, an --optimize this card's graphs cannot be given."""

    def quality(self, reference: Any, candidate: Any, seed: int) -> list[Any]:
        """An int8-dynamic export's gated figures (export/checks/quality.py's Measures)."""
        raise NotImplementedError

    def optimized_extras(self, model: nn.Module, card: Card, opset: int,
                         metadata: dict[str, str], progress: Any) -> Extras:
        return Extras()

    def layout_graphs(self, card: Card, graphs: dict[str, onnx.ModelProto]
                      ) -> dict[str, onnx.ModelProto]:
        """Graphs made from the written ones for clients that look for other files (the
        encoder-decoder's seq2seq layout, export/targets/seq2seq_layout.py); saved each on its
        own, listed in the manifest's `layout` entry (`layout_entry`)."""
        return {}

    def layout_entry(self, card: Card) -> dict[str, Any]:
        return {}

    def genai(self, card: Card, graphs: dict[str, onnx.ModelProto],
              stored_as: dict[str, str]) -> Any:
        """What ONNX Runtime GenAI needs to run this export (export/targets/genai.py's
        GenAIFiles: extra graphs and genai_config.json), or None: GenAI has no model type that
        takes this family's graphs. `stored_as`: the quantized graphs' dtype names."""
        return None
