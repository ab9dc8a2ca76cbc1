"""The encoder-decoder in the seq2seq layout the Hugging Face clients load (Optimum's
`ORTModelForSeq2SeqLM`, transformers.js's `AutoModelForSeq2SeqLM` and `translation` pipeline):
`onnx/encoder_model.onnx` and `onnx/decoder_model_merged.onnx`, made from the export's own
`encoder.onnx` and `decoder.onnx` protos (after --optimize or --quantize), nothing traced again.

- `encoder_model.onnx`: encoder.onnx with `last_hidden_state` as its only output (the cross
  keys/values are the merged decoder's to compute: the clients read no other output).
- `decoder_model_merged.onnx`: one `If` on `use_cache_branch`, Optimum's merged decoder.
  False (the first step): encoder.onnx's own cross-attention projection of
  `encoder_hidden_states`, then decoder.onnx over an empty self cache; it returns the cross
  keys/values as `present.{i}.encoder.*`, computed once per source. True (every later step):
  decoder.onnx as it is, taking them back as `past_key_values.{i}.encoder.*`; its
  `present.{i}.encoder.*` are empty constants (0, heads, 1, head_dim), as in Optimum's merged
  decoders: both clients keep the cross cache of the first step and ignore them.

Whisper's (a mel stem's card) read no masks: its encoder takes `input_features` alone, its
decoder no `encoder_attention_mask` (every frame is real), as Optimum's and transformers.js's
Whisper graphs.

Both branches read one copy of the decoder's weights (initializers of the outer graph). Every
value inside a branch is renamed under a prefix of its own, so the two pieces of the first
branch (encoder.onnx's projection, decoder.onnx) cannot collide.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterable
from typing import Any

import onnx
from onnx import TensorProto, helper

from export.onnx.trace import ExportError
from registry.catalog import Card
from registry.schema import target_vocab_size
from registry.sizes import attention_sizes
from registry.stems import is_mel_card
from runtime.contract import (
    CACHE_INPUT,
    CACHE_OUTPUT,
    DECODER,
    ENCODER,
    LAYOUT_DECODER,
    LAYOUT_ENCODER,
    USE_CACHE_BRANCH,
    past_names,
)

MEMORY = "last_hidden_state"
HIDDEN = "encoder_hidden_states"
# Optimum's axis names for the merged decoder (transformers.js fills in only `batch_size`)
TARGET = ("batch_size", "decoder_sequence_length")
SOURCE = ("batch_size", "encoder_sequence_length")
SELF_PAST = "past_decoder_sequence_length"
CROSS_PAST = "encoder_sequence_length_out"


def layout_contract(card: Card) -> dict[str, tuple[list[str], list[str]]]:
    """{file: (input names, output names)} of the two graphs, in their order."""
    n = card["n_layers"]
    source, mask = ((["input_features"], []) if is_mel_card(card)
                    else (["input_ids", "attention_mask"], ["encoder_attention_mask"]))
    return {
        LAYOUT_ENCODER: (source, [MEMORY]),
        LAYOUT_DECODER: (["input_ids", *mask, HIDDEN,
                       *past_names(n, CACHE_INPUT, DECODER, ENCODER), USE_CACHE_BRANCH],
                      ["logits", *past_names(n, CACHE_OUTPUT, DECODER, ENCODER)]),
    }


def layout_entry(card: Card) -> dict[str, Any]:
    """What manifest.json says of the layout (its `layout` entry)."""
    return {"kind": "seq2seq", "encoder": LAYOUT_ENCODER, "decoder": LAYOUT_DECODER,
            "graphs": {file: {"inputs": inputs, "outputs": outputs}
                       for file, (inputs, outputs) in layout_contract(card).items()},
            "switch": USE_CACHE_BRANCH,
            "cross_cache": f"computed once, by the first step ({USE_CACHE_BRANCH} false) from "
                           f"{HIDDEN}, returned as present.*.encoder.*; fed back as "
                           f"past_key_values.*.encoder.* with {USE_CACHE_BRANCH} true"}


def layout_graphs(card: Card, encoder: onnx.ModelProto, decoder: onnx.ModelProto
                  ) -> dict[str, onnx.ModelProto]:
    """The two graphs, new protos (the ones given are left as they are)."""
    return {LAYOUT_ENCODER: _encoder_model(encoder),
            LAYOUT_DECODER: _merged_decoder(card, encoder, decoder)}


def _needed(graph: onnx.GraphProto, outputs: Iterable[str], available: set[str]
            ) -> list[onnx.NodeProto]:
    """The nodes `outputs` are computed from, in graph order, stopping at `available`."""
    producer = {name: node for node in graph.node for name in node.output}
    kept: set[int] = set()
    stack = list(outputs)
    while stack:
        name = stack.pop()
        node = producer.get(name)
        if name in available or node is None or id(node) in kept:
            continue
        if any(a.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS)
               for a in node.attribute):
            raise ExportError(f"the clients' decoder layout: {node.op_type} node "
                              f"{node.name!r} holds a subgraph, which is not carried over")
        kept.add(id(node))
        stack.extend(node.input)
    return [node for node in graph.node if id(node) in kept]


def _used_initializers(graph: onnx.GraphProto, nodes: list[onnx.NodeProto]
                       ) -> list[onnx.TensorProto]:
    used = {name for node in nodes for name in node.input}
    return [tensor for tensor in graph.initializer if tensor.name in used]


def _encoder_model(encoder: onnx.ModelProto) -> onnx.ModelProto:
    model = copy.deepcopy(encoder)
    graph = model.graph
    nodes = _needed(graph, [MEMORY], set())
    initializers = _used_initializers(graph, nodes)
    values = {name for node in nodes for name in node.output}
    value_info = [info for info in graph.value_info if info.name in values]
    outputs = [output for output in graph.output if output.name == MEMORY]
    for field, items in (("node", nodes), ("initializer", initializers),
                         ("value_info", value_info), ("output", outputs)):
        kept = [copy.deepcopy(item) for item in items]
        graph.ClearField(field)
        getattr(graph, field).extend(kept)
    return model


def _renamed(nodes: list[onnx.NodeProto], rename: Callable[[str], str], prefix: str
             ) -> list[onnx.NodeProto]:
    copies = []
    for index, node in enumerate(nodes):
        node = copy.deepcopy(node)
        node.input[:] = [rename(name) if name else name for name in node.input]
        node.output[:] = [rename(name) if name else name for name in node.output]
        node.name = f"{prefix}{node.name or node.op_type}/{index}"  # unique: some have none
        copies.append(node)
    return copies


def _renamer(prefix: str, weights: tuple[str, set[str]], outer: set[str],
             fixed: dict[str, str] | None = None) -> Callable[[str], str]:
    """Outer inputs keep their names, a piece's initializers go under its weights' prefix
    (one copy, read by both branches), every other value under `prefix`; `fixed` names some
    values outright."""
    fixed = fixed or {}
    weights_prefix, initializers = weights

    def rename(name: str) -> str:
        if name in fixed:
            return fixed[name]
        if name in outer:
            return name
        if name in initializers:
            return weights_prefix + name
        return prefix + name

    return rename


def _tensor(name: str, shape: Iterable[int | str] | None, dtype: int) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, dtype, None if shape is None else list(shape))


def _merged_decoder(card: Card, encoder: onnx.ModelProto, decoder: onnx.ModelProto
                    ) -> onnx.ModelProto:
    n = card["n_layers"]
    sizes = attention_sizes(card)
    element = _float_type(decoder)  # float16 in a --dtype fp16 export
    self_in, self_out = past_names(n, CACHE_INPUT, DECODER), past_names(n, CACHE_OUTPUT, DECODER)
    cross_in, cross_out = past_names(n, CACHE_INPUT, ENCODER), past_names(n, CACHE_OUTPUT, ENCODER)
    step_outputs = ["logits", *self_out]
    # Optimum's order: logits, then per layer the self cache's key and value, the cross cache's
    order = ["logits", *past_names(n, CACHE_OUTPUT, DECODER, ENCODER)]
    outer = {"input_ids", "encoder_attention_mask", *self_in, *cross_in}
    decoder_weights = ("decoder/", {t.name for t in decoder.graph.initializer})
    encoder_weights = ("encoder/", {t.name for t in encoder.graph.initializer})
    decoder_nodes = _needed(decoder.graph, step_outputs, outer)
    # encoder.onnx's projection may read the source mask's shape (the same in the decoder)
    source = {MEMORY: HIDDEN, "attention_mask": "encoder_attention_mask"}
    cross_nodes = _needed(encoder.graph, cross_out, set(source))

    # First step (use_cache_branch false): project the source, attend over an empty self cache.
    empty = {name: f"empty/{name}" for name in self_in}
    projected = {name: f"cross/{name}" for name in cross_out}
    from_projection = dict(zip(cross_in, projected.values(), strict=True))
    first_nodes = [helper.make_node("Slice", [name, "layout/zero", "layout/zero", "layout/axis"],
                                    [empty[name]], name=empty[name])
                   for name in self_in]
    first_nodes += _renamed(cross_nodes, _renamer("cross/", encoder_weights, set(), source),
                            "cross/")
    first_nodes += _renamed(decoder_nodes, _renamer("first/", decoder_weights, outer,
                                                    {**empty, **from_projection}), "first/")
    first = helper.make_graph(
        first_nodes, "first_step", [],
        [_tensor(projected.get(name, f"first/{name}"), None, element) for name in order])

    # Later steps (use_cache_branch true): decoder.onnx as it is; the cross cache is the input's.
    empty_cross = helper.make_tensor("empty", element,
                                     [0, sizes.kv_heads, 1, sizes.head_dim], [])
    past_nodes = _renamed(decoder_nodes, _renamer("past/", decoder_weights, outer),
                          "past/")
    past_nodes += [helper.make_node("Constant", [], [f"past/{name}"], name=f"past/{name}",
                                    value=empty_cross) for name in cross_out]
    with_past = helper.make_graph(
        past_nodes, "with_past", [],
        [_tensor(f"past/{name}", None, element) for name in order])

    weights = [_prefixed(t, "decoder/") for t in _used_initializers(decoder.graph, decoder_nodes)]
    weights += [_prefixed(t, "encoder/") for t in _used_initializers(encoder.graph, cross_nodes)]
    weights += [helper.make_tensor("layout/zero", TensorProto.INT64, [1], [0]),
                helper.make_tensor("layout/axis", TensorProto.INT64, [1], [2])]
    switch = helper.make_node("If", [USE_CACHE_BRANCH], order,
                              name=USE_CACHE_BRANCH, then_branch=with_past, else_branch=first)
    inputs, outputs = _merged_signature(card, self_in, cross_in, order, set(projected),
                                        element)
    graph = helper.make_graph([switch], "decoder_model_merged", inputs, outputs, weights)
    model = helper.make_model(graph, opset_imports=_opsets(encoder, decoder))
    model.ir_version = max(encoder.ir_version, decoder.ir_version)
    model.functions.extend(_functions(encoder, decoder))
    model.metadata_props.extend(copy.deepcopy(decoder.metadata_props))
    return model


def _float_type(graph: onnx.ModelProto) -> int:
    """The element type of the decoder's logits: float, or float16 in an fp16 export."""
    return next(o.type.tensor_type.elem_type for o in graph.graph.output if o.name == "logits")


def _merged_signature(card: Card, self_in: list[str], cross_in: list[str], order: list[str],
                      projected: set[str], element: int
                      ) -> tuple[list[onnx.ValueInfoProto], list[onnx.ValueInfoProto]]:
    """The merged decoder's inputs (Optimum's order: per layer the self cache, then the cross
    cache; the branch flag last) and outputs (`order`), with their symbolic axes."""
    sizes = attention_sizes(card)
    kv, dh = sizes.kv_heads, sizes.head_dim
    inputs = [_tensor("input_ids", TARGET, TensorProto.INT64),
              _tensor("encoder_attention_mask", SOURCE, TensorProto.INT64),
              _tensor(HIDDEN, (*SOURCE, card["d_model"]), element)]
    if is_mel_card(card):  # Whisper's decoder reads no source mask
        inputs.pop(1)
    for layer in range(card["n_layers"]):
        inputs += [_tensor(name, ("batch_size", kv, SELF_PAST, dh), element)
                   for name in self_in[2 * layer: 2 * layer + 2]]
        inputs += [_tensor(name, ("batch_size", kv, CROSS_PAST, dh), element)
                   for name in cross_in[2 * layer: 2 * layer + 2]]
    inputs.append(_tensor(USE_CACHE_BRANCH, [1], TensorProto.BOOL))
    total = f"{SELF_PAST} + decoder_sequence_length"
    outputs = [_tensor("logits", (*TARGET, target_vocab_size(card)), element)]
    outputs += [_tensor(name, ("batch_size", kv, CROSS_PAST if name in projected else total, dh),
                        element) for name in order[1:]]
    return inputs, outputs


def _prefixed(tensor: onnx.TensorProto, prefix: str) -> onnx.TensorProto:
    tensor = copy.deepcopy(tensor)
    tensor.name = prefix + tensor.name
    return tensor


def _opsets(*models: onnx.ModelProto) -> list[onnx.OperatorSetIdProto]:
    versions: dict[str, int] = {}
    for model in models:
        for opset in model.opset_import:
            versions[opset.domain] = max(versions.get(opset.domain, 0), opset.version)
    return [helper.make_opsetid(domain, version) for domain, version in versions.items()]


def _functions(*models: onnx.ModelProto) -> list[onnx.FunctionProto]:
    found: dict[tuple[str, str], onnx.FunctionProto] = {}
    for model in models:
        for function in model.functions:
            found.setdefault((function.domain, function.name), copy.deepcopy(function))
    return list(found.values())
