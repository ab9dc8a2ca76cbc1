"""What --quantize int8-dynamic rewrites in an encoder graph before ONNX Runtime's quantizer,
so that DynamicQuantizeLinear's one uint8 scale per activation tensor loses less. Both
rewrites are exact in fp32 (x W = (x / s) (s W)); they move where the int8 rounding falls.

- **Smoothing** (SmoothQuant, Xiao et al. 2022) of the MatMuls reading a LayerNormalization:
  BERT-style encoders carry a few outlier channels there (all-MiniLM-L6-v2: channel 99 reaches
  28 where the median channel's largest value is 1.6), and one scale for the whole tensor
  leaves the other channels a dozen levels. Each channel j is divided by
  s_j = max|x_j|^α / max|W_j|^(1-α) (the weight's row j multiplied by it), with max|x_j| from
  calibration text and α per MatMul from ALPHAS by the error of the simulated int8 product
  on calibration tokens; a MatMul that smoothing helps by less than a tenth keeps its input.
  ALPHAS stops at 0.7: the calibration error keeps falling up to 0.9, but there the input is
  flattened to what calibration saw, and a channel that was quiet in it can set a whole
  tensor's range at run time (a fine-tuned all-MiniLM-L6-v2 classifier, its 100 held-out
  sentences, calibrated on 96 of its training ones: worst cosine 0.981 with 0.5-0.9, 0.999
  with 0.5-0.7).
- **Per-token scales** on the feed-forward output projection's input (the activation's
  output, whose largest values sit in a few tokens): each row is divided by its largest value
  before it is quantized, and the product's row multiplied back by it.

Measured on all-MiniLM-L6-v2, 50 lines of the shipped text in one batch, worst line's cosine
to fp32 (BENCHMARKS.md): ORT's quantizer alone 0.964; with smoothing alone 0.967 (it fixes
channels, not tokens); per-token scales on every MatMul alone 0.986; both as here 0.995;
smoothing every MatMul as well (the attention output and the feed-forward output) 0.993.
On bert-base's shape (8 x 128) the graph then runs in about 1.07x the time of ORT's
quantizer alone (the reductions, Muls and the bias Adds no longer fused).
"""

from __future__ import annotations

import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
from onnx import helper, numpy_helper

ALPHAS = (0.5, 0.6, 0.7)  # see above: 0.8 and 0.9 fit calibration, not what follows
MIN_GAIN = 0.9  # smoothing kept only where it brings the simulated error under 0.9x
SAMPLE_TOKENS = 1024  # calibration rows (tokens) the error of an alpha is measured on
CHUNK_ROWS = 8  # calibration sequences run at a time
EPSILON = 1e-6  # the least per-token scale: a row of zeros (ReLU's) is not divided by 0


@dataclass
class SmoothingReport:
    """What was rewritten, for the manifest: alpha per smoothed MatMul, per-token MatMuls."""

    smoothed: dict[str, float] = field(default_factory=dict)
    per_token: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, object]:
        return {"smoothed_matmuls": len(self.smoothed),
                "alphas": sorted(set(self.smoothed.values())),
                "per_token_matmuls": len(self.per_token)}


def weight_matmuls(graph: onnx.GraphProto) -> dict[str, list[onnx.NodeProto]]:
    """{input tensor: the MatMuls reading it with a 2-D initializer weight}, only where no
    other node reads those weights (scaling them must change nothing else)."""
    weights = {t.name for t in graph.initializer if len(t.dims) == 2}
    readers: dict[str, int] = {}
    for node in graph.node:
        for name in node.input:
            readers[name] = readers.get(name, 0) + 1
    groups: dict[str, list[onnx.NodeProto]] = {}
    for node in graph.node:
        if (node.op_type == "MatMul" and node.domain in ("", "ai.onnx")
                and node.input[1] in weights and readers[node.input[1]] == 1):
            groups.setdefault(node.input[0], []).append(node)
    return groups


@dataclass
class Seen:
    """What calibration showed of one tensor, as (rows, channels)."""

    channel_max: np.ndarray  # each channel's largest magnitude
    least: float  # the most negative value
    rows: np.ndarray  # up to SAMPLE_TOKENS of its rows, for the alpha search


def observed(model: onnx.ModelProto, names: list[str], feeds: dict[str, np.ndarray]
             ) -> dict[str, Seen]:
    """The named tensors of fp32 runs on `feeds`, CHUNK_ROWS batch rows at a time (a whole
    batch of every probed tensor is gigabytes on bert-base). Padded positions count too: left
    out, the real all-MiniLM-L6-v2's worst line fell from 0.9929 to 0.9900 over the shipped
    text's 9,023 lines and from 0.9983 to 0.9956 over 500 lines of Python (BENCHMARKS.md)."""
    probe = onnx.ModelProto()
    probe.CopyFrom(model)
    del probe.graph.output[:]
    probe.graph.output.extend(helper.make_empty_tensor_value_info(name) for name in names)
    rows = len(next(iter(feeds.values())))
    chunks = range(0, rows, CHUNK_ROWS)
    keep = -(-SAMPLE_TOKENS // len(chunks))  # rows of each tensor kept from each chunk
    rng = np.random.default_rng(0)
    parts: dict[str, list[np.ndarray]] = {name: [] for name in names}
    highs: dict[str, np.ndarray] = {}
    lows: dict[str, float] = {}
    with tempfile.TemporaryDirectory() as scratch:  # external data: no 2 GB proto limit
        path = Path(scratch) / "probe.onnx"
        onnx.save(probe, str(path), save_as_external_data=True, location="probe.data")
        session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
        wanted = {i.name for i in session.get_inputs()}
        for start in chunks:
            fed = {k: v[start:start + CHUNK_ROWS] for k, v in feeds.items() if k in wanted}
            for name, value in zip(names, session.run(names, fed), strict=True):
                flat = value.reshape(-1, value.shape[-1])
                high = np.abs(flat).max(axis=0)
                highs[name] = np.maximum(highs[name], high) if name in highs else high
                lows[name] = min(lows.get(name, 0.0), float(flat.min()))
                parts[name].append(flat[rng.permutation(len(flat))[:keep]])
    return {name: Seen(highs[name], lows[name], np.concatenate(parts[name])) for name in names}


def simulated_int8(x: np.ndarray, w: np.ndarray, weight_levels: int) -> np.ndarray:
    """x @ w as the quantized graph computes it: x as one uint8 tensor (min and max over the
    whole tensor, with 0 exact: DynamicQuantizeLinear), w per column, symmetric."""
    low, high = min(0.0, float(x.min())), max(0.0, float(x.max()))
    scale = (high - low) / 255 or 1.0
    zero = np.clip(np.round(-low / scale), 0, 255)
    x_int8 = (np.clip(np.round(x / scale) + zero, 0, 255) - zero) * scale
    columns = np.abs(w).max(axis=0) / weight_levels
    columns[columns == 0] = 1.0
    return x_int8 @ (np.clip(np.round(w / columns), -weight_levels, weight_levels) * columns)


def smoothing_scales(seen: Seen, w: np.ndarray, weight_levels: int
                     ) -> tuple[float, np.ndarray] | None:
    """(alpha, s) that brings the simulated product's error furthest down on the calibration
    rows; None when no alpha gains a tenth over leaving the input as it is."""
    rows = seen.rows
    exact = rows @ w
    norm = np.linalg.norm(exact) or 1.0

    def error(scales: np.ndarray) -> float:
        return float(np.linalg.norm(simulated_int8(rows / scales, w * scales[:, None],
                                                   weight_levels) - exact) / norm)

    channel_max = np.maximum(seen.channel_max, 1e-5)
    weight_max = np.maximum(np.abs(w).max(axis=1), 1e-5)
    plain = error(np.ones_like(channel_max))
    best: tuple[float, float, np.ndarray] | None = None
    for alpha in ALPHAS:
        scales = (channel_max ** alpha / weight_max ** (1 - alpha)).astype(np.float32)
        found = error(scales)
        if best is None or found < best[0]:
            best = (found, alpha, scales)
    assert best is not None
    return (best[1], best[2]) if best[0] < MIN_GAIN * plain else None


def _insert_before(graph: onnx.GraphProto, node: onnx.NodeProto,
                   new: list[onnx.NodeProto]) -> None:
    at = list(graph.node).index(node)
    for offset, added in enumerate(new):
        graph.node.insert(at + offset, added)


def _smooth(graph: onnx.GraphProto, x: str, nodes: list[onnx.NodeProto], scales: np.ndarray,
            initializers: dict[str, onnx.TensorProto]) -> None:
    name = f"{x}_smoothed"
    graph.initializer.append(numpy_helper.from_array((1 / scales).astype(np.float32),
                                                     f"{name}_inverse"))
    _insert_before(graph, nodes[0], [helper.make_node("Mul", [x, f"{name}_inverse"], [name],
                                                      name=f"{name}_mul")])
    for node in nodes:
        tensor = initializers[node.input[1]]
        scaled = numpy_helper.to_array(tensor) * scales[:, None]
        tensor.CopyFrom(numpy_helper.from_array(scaled.astype(np.float32), tensor.name))
        node.input[0] = name


def _per_token(graph: onnx.GraphProto, x: str, nodes: list[onnx.NodeProto], floor: float
               ) -> None:
    """x * (1 / r) before the MatMuls, each product * r after, r = max(each row's largest
    value, `floor`). Any r > 0 keeps the product exact; the row's largest value is its largest
    magnitude for an activation's output (GELU's least is -0.17, ReLU's 0), and `floor` (the
    most negative value seen in calibration) keeps a row of small values from being blown up.
    One reduction and a Mul: max |x| (ReduceMax, ReduceMin, Div) cost 1.12x, not 1.07x."""
    p = f"{x}_token"
    graph.initializer.extend([
        numpy_helper.from_array(np.array([-1], np.int64), f"{p}_axes"),
        numpy_helper.from_array(np.array(max(floor, EPSILON), np.float32), f"{p}_floor")])
    _insert_before(graph, nodes[0], [
        helper.make_node("ReduceMax", [x, f"{p}_axes"], [f"{p}_high"], keepdims=1),
        helper.make_node("Max", [f"{p}_high", f"{p}_floor"], [f"{p}_scale"]),
        helper.make_node("Reciprocal", [f"{p}_scale"], [f"{p}_inverse"]),
        helper.make_node("Mul", [x, f"{p}_inverse"], [f"{p}_scaled"])])
    for node in nodes:
        node.input[0] = f"{p}_scaled"
        product = node.output[0]
        node.output[0] = f"{product}_per_token"
        at = list(graph.node).index(node) + 1
        graph.node.insert(at, helper.make_node("Mul", [node.output[0], f"{p}_scale"],
                                               [product], name=f"{product}_rescale"))


def prepare_for_int8(model: onnx.ModelProto, calibration: dict[str, np.ndarray],
                     d_model: int, d_ff: int, weight_levels: int = 127) -> SmoothingReport:
    """Both rewrites, in place, on a graph whose tied weights are already folded."""
    graph = model.graph
    groups = weight_matmuls(graph)
    producers = {out: node for node in graph.node for out in node.output}
    initializers = {t.name: t for t in graph.initializer}
    norm_fed = [x for x in groups if x in producers
                and producers[x].op_type == "LayerNormalization"]
    token_fed = [x for x, nodes in groups.items() if x not in norm_fed and any(
        tuple(initializers[n.input[1]].dims) == (d_ff, d_model) for n in nodes)]
    seen = observed(model, norm_fed + token_fed, calibration) if groups else {}
    report = SmoothingReport()
    for x in norm_fed:
        nodes = groups[x]
        w = np.concatenate([numpy_helper.to_array(initializers[n.input[1]]) for n in nodes],
                           axis=1)
        chosen = smoothing_scales(seen[x], w, weight_levels)
        if chosen is not None:
            _smooth(graph, x, nodes, chosen[1], initializers)
            report.smoothed.update({node.name or node.output[0]: chosen[0] for node in nodes})
    for x in token_fed:
        _per_token(graph, x, groups[x], -seen[x].least)
        report.per_token += [node.name or node.output[0] for node in groups[x]]
    return report
