"""`zoo export --quantize gguf`: every linear weight a GGUF file quantized computes with the
file's own blocks (MatMulNBits, gguf_blocks.py), the tied embedding gathers from the same bytes.

The blocks come from the imported folder (zoo/files/gguf_blocks.py). A traced graph holds each
linear as MatMul(x, W^T), or, where several read one input (query, key and value; gate and up),
as one MatMul by their weights side by side (forms.py's fused_projections): such a MatMul is
split back into its weights by value, and their blocks are joined into one MatMulNBits where
the types agree (one blocksum for the minimum term of all of them), else one each and a Concat.

Before anything is written each form is dequantized here, (q - zero point) * scale + minimum
in float32 as the kernel does, and compared bit for bit with the fp32 weight the import made
with gguf's dequantize: the graph's weights are the file's. A linear with blocks that no
MatMul takes, or a type with no exact form, is refused in one line.

A mixture of experts (a MoE file's fused expert tensors, imported per expert): the plain
graph runs each expert as its own SwiGLU (zoo/blocks/experts.py), so its expert weights are
MatMuls like any linear and become MatMulNBits of their blocks, every mapped type (the
router's fp32 columns, traced side by side with the experts' gate and up, split off as an fp32
MatMul). In --optimize's graph a layer's experts are one MoE node: where they are all Q4_0 or
Q8_0 it becomes ONNX Runtime's QMoE holding their blocks (quantize_experts.py's
place_gguf_experts, checked bit for bit the same way); a layer of other types (Q4_1's minimum,
K-quants) keeps the node's fp32 copy, gguf's dequantize of the blocks (the imported weights,
exact), with a printed note saying why: never re-quantized. An expert of a type with no exact
form is refused as any tensor. The manifest gives each expert tensor's form per graph.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnx import helper, numpy_helper

from export.onnx.forms import drop_unused_initializers
from export.onnx.gguf_blocks import (
    NBitsForm,
    gather_nodes,
    nbits_nodes,
    nibble_halves,
    replace_matmuls,
    to_matmul_nbits,
)
from export.onnx.optimize import ensure_ms_opset
from export.onnx.quantize import ACCURACY_LEVEL, GGUF, fold_transposed_weights
from export.onnx.quantize_experts import (
    GGUFExperts,
    GGUFPlacement,
    experts_object,
    place_gguf_experts,
)
from registry.errors import ZooError
from zoo.files.gguf_blocks import Blocks, read_blocks

EMBEDDING, HEAD = "embeddings.token.weight", "head.weight"
EXPERTS = ".feed_forward.experts."  # a MoE layer's experts: QMoE, not MatMulNBits
# Linears whose MatMulNBits take float32 activations (accuracy_level 0) instead of int8 blocks
# (ACCURACY_LEVEL 4): on SmolLM2 the down projection's int8 rounding moved greedy tokens most
# (BENCHMARKS.md, "GGUF files"), and its 4-bit float32 kernel costs little at batch 1. Each
# expert's down projection likewise in the plain graph (QMoE takes int8 activations anyway).
FLOAT_ACTIVATIONS = re.compile(r"\.feed_forward\.(experts\.\d+\.)?down\.")


def accuracy_level(names: list[str]) -> int:
    """0 (float32 activations) where any of `names` is a down projection, else int8's."""
    return 0 if any(FLOAT_ACTIVATIONS.search(name) for name in names) else ACCURACY_LEVEL


@dataclass(frozen=True)
class GGUFWeights:
    """What the export needs: the folder's blocks, their checked forms, the fp32 weights the
    graphs' MatMuls hold (to find them by value)."""

    blocks: dict[str, Blocks]
    forms: dict[str, NBitsForm]
    weights: dict[str, np.ndarray]


def gguf_weights(folder: Path, state: dict[str, Any], tied: bool) -> GGUFWeights:
    """Read and check the imported folder's blocks against the model's `state` (torch
    tensors by name), before any tracing."""
    blocks = read_blocks(folder)
    weights = {name: value.detach().float().numpy() for name, value in state.items()
               if name in blocks}
    if tied and EMBEDDING in weights:
        weights[HEAD] = weights[EMBEDDING]
    return GGUFWeights(blocks, gguf_forms(blocks, weights, tied), weights)


def gguf_forms(blocks: dict[str, Blocks], weights: dict[str, np.ndarray], tied: bool,
               ) -> dict[str, NBitsForm]:
    """Each weight's MatMulNBits form, checked bit for bit against the fp32 weight; the tied
    head takes the embedding's (the same bytes, stored once)."""
    forms = {}
    for name, found in blocks.items():
        if name not in weights:
            raise ZooError(f"{found.source}: the model has no weight {name} for its blocks")
        forms[name] = to_matmul_nbits(found.source, found.ggml_type, found.raw, found.shape)
        check_exact(found.source, forms[name], weights[name])
    if tied and EMBEDDING in forms and HEAD not in forms:
        forms[HEAD] = forms[EMBEDDING]
    return forms


def dequantized(form: NBitsForm) -> np.ndarray:
    """(N, K) float32 weights the form holds: (q - zero point) * scale + minimum."""
    b = form.b.reshape(form.n, -1)
    codes = b if form.bits == 8 else np.stack([b & 0x0F, b >> 4], axis=-1).reshape(form.n, -1)
    blocks = form.k // form.block_size
    if form.zero_points is None:
        zero = np.full((form.n, blocks), 2 ** (form.bits - 1), np.float32)
    elif form.bits == 8:
        zero = form.zero_points.reshape(form.n, blocks).astype(np.float32)
    else:
        packed = form.zero_points.reshape(form.n, -1)
        zero = np.stack([packed & 0x0F, packed >> 4], -1).reshape(form.n, -1)[:, :blocks]
        zero = zero.astype(np.float32)
    grouped = codes.reshape(form.n, blocks, form.block_size).astype(np.float32)
    scale = form.scales.reshape(form.n, blocks, 1)
    values = (grouped - zero[..., None]) * scale
    if form.minimums is not None:
        values = values + form.minimums.T[..., None]
    return values.reshape(form.n, form.k)


def check_exact(name: str, form: NBitsForm, weight: np.ndarray) -> None:
    """The form's weights equal `weight` bit for bit (+0.0 folds -0.0 into 0.0)."""
    held = dequantized(form) + np.float32(0.0)
    expected = np.asarray(weight, np.float32) + np.float32(0.0)
    if form.bits == 8:  # and its 4-bit halves (float32 activations) give the same weights
        halves = dequantized(nibble_halves(form))
        folded = halves[:, :form.k] + halves[:, form.k:] + np.float32(0.0)
        if form.minimums is not None:
            folded = folded + np.repeat(form.minimums.T, form.block_size, axis=1)
        held = held if np.array_equal(folded.view(np.uint32), held.view(np.uint32)) else folded
    if held.shape != expected.shape or not np.array_equal(held.view(np.uint32),
                                                          expected.view(np.uint32)):
        raise ZooError(f"{name}: its {form.ggml_type} blocks as MatMulNBits do not give the "
                       "imported weights bit for bit (re-import the GGUF file)")


def form_label(form: NBitsForm) -> str:
    """The MatMulNBits form in words, for the manifest."""
    zero = ("default" if form.zero_points is None
            else int(dequantized_zero(form)))
    minimum = ", + block minimums" if form.minimums is not None else ""
    return f"MatMulNBits bits {form.bits}, block {form.block_size}, zero point {zero}{minimum}"


def dequantized_zero(form: NBitsForm) -> int:
    return int(form.zero_points.reshape(-1)[0] & (0xFF if form.bits == 8 else 0x0F))


def _joinable(forms: list[NBitsForm]) -> bool:
    first = forms[0]
    return all((f.bits, f.block_size, f.k, f.zero_points is None, f.minimums is None)
               == (first.bits, first.block_size, first.k, first.zero_points is None,
                   first.minimums is None) for f in forms) and (
        first.zero_points is None or len({dequantized_zero(f) for f in forms}) == 1)


def joined(forms: list[NBitsForm]) -> NBitsForm:
    """Forms of one input width side by side: one MatMulNBits of their summed outputs."""
    first = forms[0]
    return replace(
        first, ggml_type="+".join(f.ggml_type for f in forms), n=sum(f.n for f in forms),
        b=np.concatenate([f.b for f in forms]),
        scales=np.concatenate([f.scales for f in forms]),
        zero_points=None if first.zero_points is None
        else np.concatenate([f.zero_points for f in forms]),
        minimums=None if first.minimums is None
        else np.concatenate([f.minimums for f in forms], axis=1))


def _segments(constant: np.ndarray, columns: dict[bytes, str], weights: dict[str, np.ndarray]
              ) -> list[tuple[str | None, int, int]]:
    """`constant` (K, N) cut into (name, start, end) where its columns are a weight's transpose
    and (None, start, end) runs of others (a router's fp32 columns beside its experts')."""
    segments: list[tuple[str | None, int, int]] = []
    offset = 0
    while offset < constant.shape[1]:
        name = columns.get(np.ascontiguousarray(constant[:, offset]).tobytes())
        end = offset + (weights[name].shape[0] if name else 1)
        if name is None or not np.array_equal(constant[:, offset:end], weights[name].T):
            name, end = None, offset + 1
        if name is None and segments and segments[-1][0] is None:
            segments[-1] = (None, segments[-1][1], end)
        else:
            segments.append((name, offset, end))
        offset = end
    return segments


def _runs(segments: list[tuple[str | None, int, int]]) -> list[tuple[list[str], int, int]]:
    """Adjacent named segments as one run ([names], start, end); a run of others ([], ...)."""
    runs: list[tuple[list[str], int, int]] = []
    for name, start, end in segments:
        if name is not None and runs and runs[-1][0]:
            runs[-1] = (runs[-1][0] + [name], runs[-1][1], end)
        else:
            runs.append(([name] if name else [], start, end))
    return runs


def _run_nodes(names: list[str], x: str, y: str, forms: dict[str, NBitsForm],
               weights: dict[str, np.ndarray]) -> tuple[list[onnx.NodeProto],
                                                        list[onnx.TensorProto]]:
    """y = x @ the weights `names` side by side: one MatMulNBits where their forms join,
    else one each and a Concat."""
    parts = [forms[name] for name in names]
    if len(parts) == 1 or _joinable(parts):
        form = parts[0] if len(parts) == 1 else joined(parts)
        if len(parts) > 1:
            check_exact("+".join(names), form, np.concatenate([weights[n] for n in names]))
        return nbits_nodes(form, x, y, "+".join(names), accuracy_level(names))
    nodes, inits = [], []
    for name, form in zip(names, parts, strict=True):
        more, extra = nbits_nodes(form, x, f"{name}.out", name, accuracy_level([name]))
        nodes, inits = nodes + more, inits + extra
    nodes.append(helper.make_node("Concat", [f"{name}.out" for name in names], [y], axis=-1))
    return nodes, inits


def replace_joined(model: onnx.ModelProto, forms: dict[str, NBitsForm],
                   weights: dict[str, np.ndarray]) -> list[str]:
    """The MatMuls whose constant is several weights side by side (with, it may be, columns
    of no blocks: those stay an fp32 MatMul, Concat after); returns the names taken."""
    graph = model.graph
    initializers = {tensor.name: tensor for tensor in graph.initializer}
    columns = {np.ascontiguousarray(weights[name][0]).astype(np.float32).tobytes(): name
               for name in forms}
    taken = []
    for node in list(graph.node):
        constant = initializers.get(node.input[1]) if node.op_type == "MatMul" else None
        if constant is None or len(constant.dims) != 2:
            continue
        value = numpy_helper.to_array(constant).astype(np.float32)
        runs = _runs(_segments(value, columns, weights))
        names = [name for run, _, _ in runs for name in run]
        if not names or (len(names) == 1 and len(runs) == 1):
            continue  # no blocks, or one weight alone: replace_matmuls'
        x, y = node.input[0], node.output[0]
        if len(runs) == 1:
            nodes, inits = _run_nodes(names, x, y, forms, weights)
        else:
            nodes, inits = [], []
            for index, (run, start, end) in enumerate(runs):
                part = f"{y}.part{index}"
                if run:
                    more, extra = _run_nodes(run, x, part, forms, weights)
                else:  # columns without blocks, as they were
                    extra = [numpy_helper.from_array(np.ascontiguousarray(
                        value[:, start:end]), f"{part}.weight")]
                    more = [helper.make_node("MatMul", [x, f"{part}.weight"], [part])]
                nodes, inits = nodes + more, inits + extra
            nodes.append(helper.make_node("Concat", [f"{y}.part{index}" for index in
                                                     range(len(runs))], [y], axis=-1))
        position = list(graph.node).index(node)
        graph.node.remove(node)
        for offset, new in enumerate(nodes):
            graph.node.insert(position + offset, new)
        graph.initializer.extend(inits)
        taken += names
    return taken


def replace_gathers(model: onnx.ModelProto, form: NBitsForm, weight: np.ndarray) -> int:
    """Each Gather from the embedding table (matched by value) as GatherBlockQuantized."""
    graph = model.graph
    initializers = {tensor.name: tensor for tensor in graph.initializer}
    wanted = np.ascontiguousarray(weight, np.float32).tobytes()
    count = 0
    for node in list(graph.node):
        table = initializers.get(node.input[0]) if node.op_type == "Gather" else None
        if table is None or len(table.dims) != 2 or \
                numpy_helper.to_array(table).astype(np.float32).tobytes() != wanted:
            continue
        nodes, inits = gather_nodes(form, node.input[1], node.output[0], f"{EMBEDDING}.{count}")
        position = list(graph.node).index(node)
        graph.node.remove(node)
        for offset, new in enumerate(nodes):
            graph.node.insert(position + offset, new)
        graph.initializer.extend(inits)
        count += 1
    return count


def quantize_gguf(model: onnx.ModelProto, forms: dict[str, NBitsForm],
                  weights: dict[str, np.ndarray], file: str
                  ) -> tuple[onnx.ModelProto, int, GGUFPlacement]:
    """Every linear with blocks as MatMulNBits (an expert's too, where a MatMul holds it: the
    plain graph's), a MoE node's experts as QMoE where their types allow, the embedding as
    GatherBlockQuantized; returns the model, its MatMulNBits count and what became of its MoE
    nodes. A linear left unmatched is refused by name, unless a MoE node left fp32 holds it."""
    fold_transposed_weights(model)
    layers = gguf_expert_layers(forms, weights)
    placement = place_gguf_experts(model, layers, ACCURACY_LEVEL, file)
    in_nodes = set(placement.qmoe) | set(placement.left)  # layers a MoE node holds here
    # a MoE node of no known layer (weights not constant) holds its experts fp32 somewhere
    unknown = bool(in_nodes - {layer.prefix for layer in layers})
    linears = {name: form for name, form in forms.items() if name != EMBEDDING and not (
        EXPERTS in name and _expert_parts(name)[0] in in_nodes)}
    taken = set(replace_joined(model, linears, weights))
    rest = {name: form for name, form in linears.items() if name not in taken}
    for level in sorted({accuracy_level([name]) for name in rest}):
        taken |= set(replace_matmuls(model, {name: form for name, form in rest.items()
                                             if accuracy_level([name]) == level},
                                     weights, level))
    missing = sorted(name for name in set(linears) - taken
                     if not (EXPERTS in name and unknown))
    if missing:
        raise ZooError(f"{file}: no MatMul computes {', '.join(missing[:4])}"
                       f"{' ...' if len(missing) > 4 else ''} with the weights the file's "
                       "blocks hold: --quantize gguf cannot place them")
    if EMBEDDING in forms:
        replace_gathers(model, forms[EMBEDDING], weights[EMBEDDING])
    ensure_ms_opset(model)
    _one_of_each_name(model.graph)
    drop_unused_initializers(model.graph)
    return model, sum(node.op_type == "MatMulNBits" for node in model.graph.node), placement


def _one_of_each_name(graph: onnx.GraphProto) -> None:
    """The shared blocksum matrices were added once per linear: keep the first of each name."""
    seen, kept = set(), []
    for tensor in graph.initializer:
        if tensor.name not in seen:
            seen.add(tensor.name)
            kept.append(tensor)
    del graph.initializer[:]
    graph.initializer.extend(kept)


def manifest_entry(blocks: dict[str, Blocks], forms: dict[str, NBitsForm],
                   counts: dict[str, int], experts: dict[str, str] | None = None,
                   described: dict[str, Any] | None = None) -> dict[str, Any]:
    """What manifest.json says of a gguf export: per tensor its type and form (`experts`: an
    expert weight's, per graph), counts, and `described`: the QMoE nodes (experts_object)."""
    types = Counter(found.ggml_type for found in blocks.values())
    return {
        "weights": GGUF,
        "activations": "fp32 in and out; accuracy_level 4 lets MatMulNBits quantize activation "
                       "blocks to int8 inside its dot products, except the linears named in "
                       "float_activations (accuracy_level 0: fp32 activations; an 8-bit form "
                       "there runs as two 4-bit halves on [x, x], the same weights exactly)",
        "accuracy_level": ACCURACY_LEVEL,
        "float_activations": [name for name in blocks if accuracy_level([name]) == 0],
        "method": "the GGUF file's own blocks (export/onnx/gguf_blocks.py), no re-quantization",
        "types": dict(sorted(types.items())),
        "tensors": {name: {"gguf": found.source, "ggml_type": found.ggml_type,
                           "form": (experts or {}).get(name) or form_label(forms[name])
                           + _embedding_note(name, forms, blocks)}
                    for name, found in blocks.items()},
        "exact": "every form's (q - zero point) * scale + minimum equals the imported weight "
                 "(gguf's dequantize) bit for bit",
        "matmuls": counts,
        "check": "top-1 agreement with the fp32 dequantized model instead of the parity grid",
    } | ({"experts": described} if described else {})


def _embedding_note(name: str, forms: dict[str, NBitsForm], blocks: dict[str, Blocks]) -> str:
    if name != EMBEDDING:
        return ""
    tied = HEAD in forms and HEAD not in blocks
    return "; gathered by GatherBlockQuantized" + (", the tied head's MatMulNBits from the "
                                                   "same bytes" if tied else "")


def type_counts_line(blocks: dict[str, Blocks]) -> str:
    types = Counter(found.ggml_type for found in blocks.values())
    return "GGUF blocks kept: " + ", ".join(f"{count} {kind}" for kind, count in
                                            sorted(types.items()))


def _expert_parts(name: str) -> tuple[str, int, str]:
    """"layers.0.feed_forward.experts.3.gate.weight" -> (its layer's prefix, 3, "gate")."""
    prefix, rest = name.split(EXPERTS)
    index, part = rest.split(".")[:2]
    return prefix + EXPERTS.rstrip("."), int(index), part


def _expert_names(names: Any) -> dict[str, dict[str, dict[int, str]]]:
    """{layer prefix: {"gate"|"up"|"down": {expert: weight name}}} of the expert weights."""
    layers: dict[str, dict[str, dict[int, str]]] = {}
    for name in names:
        if EXPERTS in name:
            prefix, index, part = _expert_parts(name)
            layers.setdefault(prefix, {}).setdefault(part, {})[index] = name
    return layers


def gguf_expert_layers(forms: dict[str, NBitsForm], weights: dict[str, np.ndarray]
                       ) -> list[GGUFExperts]:
    """The layers whose every expert weight has blocks (gate, up and down), in their forms."""
    found = []
    for prefix, parts in _expert_names(weights).items():
        names = [name for part in parts.values() for name in part.values()]
        if set(parts) != {"gate", "up", "down"} or not all(name in forms for name in names):
            continue
        ordered = {part: [parts[part][index] for index in sorted(parts[part])]
                   for part in parts}
        found.append(GGUFExperts(
            prefix, *([forms[name] for name in ordered[part]] for part in ("gate", "up", "down")),
            fc2=[weights[name] for name in ordered["down"]]))
    return found


def expert_outcome(protos: dict[str, onnx.ModelProto], placements: dict[str, GGUFPlacement],
                   blocks: dict[str, Blocks], forms: dict[str, NBitsForm],
                   ) -> tuple[list[str], dict[str, str], dict[str, Any] | None]:
    """What became of the file's quantized experts in each graph: the notes to print, each
    expert weight's form per graph for the manifest, and its `experts` object. An expert is
    QMoE where its layer's MoE node took its blocks, MatMulNBits where a MatMul held it (the
    plain graph runs each expert as its own SwiGLU), else the MoE node's fp32 copy: gguf's
    dequantize of its blocks (the imported weights), never re-quantized."""
    layers = _expert_names(blocks)
    if not layers:
        return [], {}, None
    notes, labels = [], {name: [] for name in blocks if EXPERTS in name}
    for file, proto in protos.items():
        placed, left = placements[file].qmoe, placements[file].left
        if placed:
            widths = sorted({f"{bits}-bit" for bits in placed.values()})
            notes.append(f"{len(placed)} MoE layers in {file} are QMoE holding the file's "
                         f"blocks ({', '.join(widths)})")
        notes += [f"note: {file}: {where} stay fp32 dequantized (exact): {why}"
                  for where, why in left.items()]
        nbits = {name for node in proto.graph.node if node.op_type == "MatMulNBits"
                 for name in node.name.removesuffix(".MatMulNBits").split("+")}
        for name in labels:
            prefix = _expert_parts(name)[0]
            if prefix in placed:
                label = (f"QMoE bits {placed[prefix]}, block 32, zero point default"
                         f"{_widened(blocks[name], placed[prefix])}")
            else:
                label = form_label(forms[name]) if name in nbits else "fp32 dequantized"
            labels[name].append(f"{label} ({file})")
    left = {file: placement.left for file, placement in placements.items()}
    described = experts_object(protos, left, "the GGUF file's own Q4_0/Q8_0 blocks (bits 4: "
                               "(q - 8) * d; bits 8: (q - 128) * d, a Q4_0/Q8_0 layer's Q4_0 "
                               "codes + 120), fp32 scales of the file's float16 d")
    return notes, {name: "; ".join(found) for name, found in labels.items()}, described


def _widened(found: Blocks, bits: int) -> str:
    return ", Q4_0 codes + 120" if found.ggml_type == "Q4_0" and bits == 8 else ""
