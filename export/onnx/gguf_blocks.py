"""A GGUF tensor's own quantized blocks as ONNX Runtime MatMulNBits inputs, exactly.

A linear weight in a GGUF file is N rows (output features) of blocks along K (input features).
Each ggml type maps to MatMulNBits codes `q` (bits 4 or 8, low nibble first), an fp32 scale per
block and a constant zero point, so that (q - zero_point) * scale is the product `gguf`'s
dequantize computes. Types with a block minimum (Q4_1, Q5_1, and the K-quants' -dmin*m) add it
as a second, block-size times smaller product: y = MatMulNBits(x) + blocksum(x) @ M, which is
what dequantize's d*q + m gives once summed. Other types are refused, never re-quantized.

An embedding gathers rows from the same blocks with GatherBlockQuantized (+ its minimums).
numpy and onnx only (no torch, no gguf): the raw blocks come from the file reader.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np
import onnx
from onnx import NodeProto, TensorProto, helper, numpy_helper

from registry.errors import ZooError

# ggml type: (values per block, bytes per block), as in gguf's GGML_QUANT_SIZES
BLOCKS = {"Q4_0": (32, 18), "Q4_1": (32, 20), "Q5_0": (32, 22), "Q5_1": (32, 24),
          "Q8_0": (32, 34), "Q4_K": (256, 144), "Q5_K": (256, 176), "Q6_K": (256, 210)}
MAPPED = tuple(BLOCKS)
DEFAULT_ZERO = {4: 8, 8: 128}  # MatMulNBits' zero point when the input is left out


@dataclass(frozen=True)
class NBitsForm:
    """MatMulNBits inputs for a weight of K inputs and N outputs (y = x @ W^T)."""

    ggml_type: str
    k: int
    n: int
    bits: int
    block_size: int
    b: np.ndarray               # uint8 (N, K / block_size, block_size * bits / 8)
    scales: np.ndarray          # float32 (N * K / block_size,)
    zero_points: np.ndarray | None  # packed uint8, None where the operator's default is it
    minimums: np.ndarray | None     # float32 (K / block_size, N): y += blocksum(x) @ minimums

    def nbytes(self) -> int:
        arrays = (self.b, self.scales, self.zero_points, self.minimums)
        return sum(a.nbytes for a in arrays if a is not None)


def _f16(column: np.ndarray) -> np.ndarray:
    """(rows, 2) uint8 bytes of a little-endian float16 -> (rows, 1) float32."""
    return np.ascontiguousarray(column).view("<f2").astype(np.float32)


def _nibbles(qs: np.ndarray, group: int) -> np.ndarray:
    """ggml's 4-bit layout: in each `group` bytes, the low nibbles are `group` values, then the
    high nibbles the next `group`. (rows, bytes) -> (rows, 2 * bytes) codes in value order."""
    rows = qs.shape[0]
    split = qs.reshape(rows, -1, 1, group) >> np.array([0, 4], np.uint8).reshape(1, 1, 2, 1)
    return (split & 0x0F).reshape(rows, -1)


def _high_bits(qh: np.ndarray, count: int) -> np.ndarray:
    """Q5_0/Q5_1: bit j of a little-endian uint32 is value j's fifth bit. -> (rows, 32)."""
    return np.unpackbits(qh, axis=-1, bitorder="little")[:, :count]


def _k_scale_min(scales: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Q4_K/Q5_K: twelve bytes of eight 6-bit scales and eight 6-bit minimums (ggml's
    get_scale_min_k4). (rows, 12) -> two (rows, 8) uint8."""
    d, m, m_d = scales[:, 0:4], scales[:, 4:8], scales[:, 8:12]
    sc = np.concatenate([d & 0x3F, (m_d & 0x0F) | ((d >> 2) & 0x30)], axis=-1)
    mn = np.concatenate([m & 0x3F, (m_d >> 4) | ((m >> 2) & 0x30)], axis=-1)
    return sc, mn


def _decode(kind: str, blocks: np.ndarray) -> tuple[np.ndarray, np.ndarray, int, int, int,
                                                    np.ndarray | None]:
    """(n_blocks, type_size) raw blocks -> codes (n_blocks, values), scales (n_blocks, sub),
    bits, sub-block size, zero point, minimums (n_blocks, sub) or None."""
    rows = blocks.shape[0]
    if kind == "Q8_0":
        codes = blocks[:, 2:] ^ np.uint8(0x80)  # int8 q -> q + 128
        return codes, _f16(blocks[:, :2]), 8, 32, 128, None
    if kind == "Q4_0":
        return _nibbles(blocks[:, 2:], 16), _f16(blocks[:, :2]), 4, 32, 8, None
    if kind == "Q4_1":
        return _nibbles(blocks[:, 4:], 16), _f16(blocks[:, :2]), 4, 32, 0, _f16(blocks[:, 2:4])
    if kind in ("Q5_0", "Q5_1"):
        start = 2 if kind == "Q5_0" else 4
        high = _high_bits(blocks[:, start:start + 4], 32)
        codes = _nibbles(blocks[:, start + 4:], 16) | (high << 4)
        if kind == "Q5_0":
            return codes, _f16(blocks[:, :2]), 8, 32, 16, None
        return codes, _f16(blocks[:, :2]), 8, 32, 0, _f16(blocks[:, 2:4])
    if kind in ("Q4_K", "Q5_K"):
        d, dmin = _f16(blocks[:, :2]), _f16(blocks[:, 2:4])
        sc, mn = _k_scale_min(blocks[:, 4:16])
        scales = d * sc.astype(np.float32)            # dequantize's d*sc, rounded as it is
        minimums = -(dmin * mn.astype(np.float32))    # ... minus dmin*m
        if kind == "Q4_K":
            return _nibbles(blocks[:, 16:], 32), scales, 4, 32, 0, minimums
        qh = blocks[:, 16:48].reshape(rows, 1, 32) >> np.arange(8, dtype=np.uint8).reshape(1, 8, 1)
        codes = _nibbles(blocks[:, 48:], 32) | ((qh & 1).reshape(rows, -1) << 4)
        return codes, scales, 8, 32, 0, minimums
    # Q6_K: 128 bytes of low nibbles, 64 of 2-bit highs, 16 int8 scales, float16 d
    low = _nibbles(blocks[:, :128], 64)
    shifts = np.array([0, 2, 4, 6], np.uint8).reshape(1, 1, 4, 1)
    qh = blocks[:, 128:192].reshape(rows, 2, 1, 32) >> shifts
    codes = low | ((qh & 3).reshape(rows, -1) << 4)
    scales = _f16(blocks[:, 208:210]) * blocks[:, 192:208].view(np.int8).astype(np.float32)
    return codes, scales, 8, 16, 32, None


def _pack(codes: np.ndarray, bits: int) -> np.ndarray:
    """Codes (..., count) -> MatMulNBits bytes: 8-bit as is, 4-bit two a byte, low nibble first."""
    codes = codes.astype(np.uint8)
    if bits == 8:
        return codes
    return codes[..., 0::2] | (codes[..., 1::2] << 4)


def to_matmul_nbits(name: str, ggml_type: str, raw: np.ndarray, shape: tuple[int, int],
                    ) -> NBitsForm:
    """One GGUF tensor's raw bytes (its rows of blocks) as MatMulNBits inputs.
    `shape` is (N, K) = (output features, input features); `name` is for the error line."""
    if ggml_type not in BLOCKS:
        raise ZooError(f"{name}: ggml type {ggml_type} has no exact MatMulNBits form "
                       f"(mapped: {', '.join(MAPPED)}); it is not re-quantized")
    n, k = shape
    block, size = BLOCKS[ggml_type]
    raw = np.ascontiguousarray(raw, dtype=np.uint8).reshape(-1)
    if k % block or raw.size != n * (k // block) * size:
        raise ZooError(f"{name}: {raw.size} bytes of {ggml_type} do not hold a {n} x {k} "
                       f"weight (blocks of {block} values, {size} bytes)")
    codes, scales, bits, sub, zero, minimums = _decode(ggml_type, raw.reshape(-1, size))
    blocks_per_row = k // sub
    b = _pack(codes.reshape(n, blocks_per_row, sub), bits)
    return NBitsForm(
        ggml_type=ggml_type, k=k, n=n, bits=bits, block_size=sub, b=b,
        scales=np.ascontiguousarray(scales, dtype=np.float32).reshape(-1),
        zero_points=_zero_points(zero, bits, n, blocks_per_row),
        minimums=None if minimums is None
        else np.ascontiguousarray(minimums.reshape(n, blocks_per_row).T, dtype=np.float32))


def _zero_points(zero: int, bits: int, n: int, blocks_per_row: int) -> np.ndarray | None:
    """A constant zero point as MatMulNBits packs them: per row, `bits` each, low nibble first,
    a row padded to whole bytes. None where it equals the operator's default."""
    if zero == DEFAULT_ZERO[bits]:
        return None
    if bits == 8:
        return np.full(n * blocks_per_row, zero, np.uint8)
    row = _pack(np.full((n, blocks_per_row + blocks_per_row % 2), zero, np.uint8), 4)
    return row.reshape(-1)


def blocksum_name(k: int, block: int) -> str:
    """The one (K, K / block) summing matrix every minimum term of that size shares (a caller
    that adds several to one graph keeps the first of each name)."""
    return f"gguf.blocksum.{k}x{block}"


def nibble_halves(form: NBitsForm) -> NBitsForm:
    """An 8-bit form as one 4-bit form of twice the inputs, for x twice side by side [x, x]:
    code c = 16 * hi + lo, so (c - z) * s = (hi - z // 16) * 16s + (lo - z % 16) * s, each
    term and their sum exact in float32 (integers of at most 12 bits times a float16 scale).
    The same bytes; the minimums (if any) stay the caller's, on x."""
    zero = DEFAULT_ZERO[8] if form.zero_points is None else int(form.zero_points[0])
    per_row = form.k // form.block_size
    codes = form.b.reshape(form.n, per_row, form.block_size)
    scales = form.scales.reshape(form.n, per_row)
    zeros = np.concatenate([np.full((form.n, per_row), zero // 16, np.uint8),
                            np.full((form.n, per_row), zero % 16, np.uint8)], axis=1)
    return NBitsForm(
        ggml_type=form.ggml_type, k=2 * form.k, n=form.n, bits=4, block_size=form.block_size,
        b=_pack(np.concatenate([codes >> 4, codes & 0x0F], axis=1), 4),
        scales=np.ascontiguousarray(np.concatenate([scales * np.float32(16), scales], axis=1)
                                    ).reshape(-1),
        zero_points=_pack(zeros, 4).reshape(-1), minimums=None)


def widened(form: NBitsForm) -> NBitsForm:
    """A 4-bit form with the default zero point (8) as 8 bits with theirs (128): each code
    plus 120, so (q + 120 - 128) * scale is the same product, exactly. For one operator that
    takes a single width for weights of both (QMoE's expert_weight_bits)."""
    if form.bits == 8:
        return form
    if form.zero_points is not None or form.minimums is not None:
        raise ValueError(f"{form.ggml_type}: only a default-zero-point 4-bit form widens")
    packed = form.b.reshape(form.n, -1)
    codes = np.stack([packed & 0x0F, packed >> 4], axis=-1) + np.uint8(120)
    return replace(form, bits=8, b=codes.reshape(form.n, form.k // form.block_size,
                                                 form.block_size))


def nbits_nodes(form: NBitsForm, x: str, y: str, prefix: str, accuracy_level: int = 4,
                ) -> tuple[list[NodeProto], list[TensorProto]]:
    """Nodes and initializers for y = x @ W^T with W in `form`; x is (..., K) float32.
    At accuracy_level 0 (float32 activations) an 8-bit form runs as its nibble_halves on
    [x, x]: ONNX Runtime's CPU kernel has a float32-activation path for 4 bits, while 8 bits
    there dequantize the whole weight every call (about 10x slower for SmolLM2's head)."""
    held, x_in, pre = form, x, []
    if accuracy_level == 0 and form.bits == 8:
        held, x_in = nibble_halves(form), f"{prefix}.halves"
        pre = [helper.make_node("Concat", [x, x], [x_in], axis=-1)]
    inits = [numpy_helper.from_array(held.b, f"{prefix}.B"),
             numpy_helper.from_array(held.scales, f"{prefix}.scales")]
    inputs = [x_in, f"{prefix}.B", f"{prefix}.scales"]
    if held.zero_points is not None:
        inits.append(numpy_helper.from_array(held.zero_points, f"{prefix}.zero_points"))
        inputs.append(f"{prefix}.zero_points")
    product = y if form.minimums is None else f"{prefix}.scaled"
    nodes = pre + [helper.make_node(
        "MatMulNBits", inputs, [product], name=f"{prefix}.MatMulNBits", domain="com.microsoft",
        K=held.k, N=held.n, bits=held.bits, block_size=held.block_size,
        accuracy_level=accuracy_level)]
    if form.minimums is None:
        return nodes, inits
    # blocksum(x) as x @ E, E (K, K / block) of 0s and 1s: one MatMul, any rank of x, no
    # shape nodes (each node costs a decode step microseconds: 4 linears a layer)
    p = prefix
    ones = np.kron(np.eye(form.k // form.block_size, dtype=np.float32),
                   np.ones((form.block_size, 1), np.float32))
    summed = blocksum_name(form.k, form.block_size)
    inits += [numpy_helper.from_array(ones, summed),
              numpy_helper.from_array(form.minimums, f"{p}.minimums")]
    nodes += [
        helper.make_node("MatMul", [x, summed], [f"{p}.blocksum"]),
        helper.make_node("MatMul", [f"{p}.blocksum", f"{p}.minimums"], [f"{p}.shift"]),
        helper.make_node("Add", [product, f"{p}.shift"], [y]),
    ]
    return nodes, inits


def gather_nodes(form: NBitsForm, ids: str, y: str, prefix: str,
                 ) -> tuple[list[NodeProto], list[TensorProto]]:
    """Nodes and initializers for y = W[ids] (an embedding of N rows of K values) from the same
    blocks, through GatherBlockQuantized; a block minimum is gathered and added per block."""
    p = prefix
    blocks = form.k // form.block_size
    inits = [numpy_helper.from_array(form.b.reshape(form.n, -1), f"{p}.data"),
             numpy_helper.from_array(form.scales.reshape(form.n, blocks), f"{p}.scales")]
    inputs = [f"{p}.data", ids, f"{p}.scales"]
    if form.zero_points is not None:
        inits.append(numpy_helper.from_array(form.zero_points.reshape(form.n, -1), f"{p}.zp"))
        inputs.append(f"{p}.zp")
    scaled = y if form.minimums is None else f"{p}.scaled"
    nodes = [helper.make_node("GatherBlockQuantized", inputs, [scaled], name=f"{p}.Gather",
                              domain="com.microsoft", gather_axis=0, quantize_axis=1,
                              block_size=form.block_size, bits=form.bits)]
    if form.minimums is None:
        return nodes, inits
    # (..., K) viewed as (..., blocks, block) plus each row's (..., blocks, 1) minimums
    inits += [numpy_helper.from_array(np.ascontiguousarray(form.minimums.T), f"{p}.minimums"),
              numpy_helper.from_array(np.array([blocks, form.block_size], np.int64),
                                      f"{p}.block_shape"),
              numpy_helper.from_array(np.array([form.k], np.int64), f"{p}.row_shape"),
              numpy_helper.from_array(np.array([-1], np.int64), f"{p}.last")]
    nodes += [
        helper.make_node("Gather", [f"{p}.minimums", ids], [f"{p}.row_minimums"], axis=0),
        helper.make_node("Unsqueeze", [f"{p}.row_minimums", f"{p}.last"], [f"{p}.shift"]),
        helper.make_node("Shape", [ids], [f"{p}.ids_shape"]),
        helper.make_node("Concat", [f"{p}.ids_shape", f"{p}.block_shape"], [f"{p}.blocked_shape"],
                         axis=0),
        helper.make_node("Concat", [f"{p}.ids_shape", f"{p}.row_shape"], [f"{p}.out_shape"],
                         axis=0),
        helper.make_node("Reshape", [scaled, f"{p}.blocked_shape"], [f"{p}.blocked"]),
        helper.make_node("Add", [f"{p}.blocked", f"{p}.shift"], [f"{p}.shifted"]),
        helper.make_node("Reshape", [f"{p}.shifted", f"{p}.out_shape"], [y]),
    ]
    return nodes, inits


def replace_matmuls(model: onnx.ModelProto, forms: dict[str, NBitsForm],
                    weights: dict[str, np.ndarray], accuracy_level: int = 4) -> dict[str, str]:
    """Replace each MatMul(x, C) whose constant C (K, N) is, value for value, the transpose of
    `weights[name]` (the fp32 (N, K) the export computed with) by `forms[name]`'s nodes.
    Matched by value, not name, so the exporter's initializer names do not matter.
    Returns {name: the initializer it replaced}; names not found are the caller's to report."""
    graph = model.graph
    initializers = {tensor.name: tensor for tensor in graph.initializer}
    wanted = {np.ascontiguousarray(weights[name].T, np.float32).tobytes(): name for name in forms}
    replaced: dict[str, str] = {}
    for node in list(graph.node):
        constant = initializers.get(node.input[1]) if node.op_type == "MatMul" else None
        if constant is None or len(constant.dims) != 2:
            continue
        name = wanted.get(numpy_helper.to_array(constant).astype(np.float32).tobytes())
        if name is None or name in replaced:
            continue
        nodes, inits = nbits_nodes(forms[name], node.input[0], node.output[0], name,
                                   accuracy_level)
        position = list(graph.node).index(node)
        graph.node.remove(node)
        for offset, new in enumerate(nodes):
            graph.node.insert(position + offset, new)
        graph.initializer.extend(inits)
        replaced[name] = constant.name
    return replaced
