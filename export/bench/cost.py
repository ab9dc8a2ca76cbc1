"""How much work a forward pass or a decoding step is, to scale timings by the machine's limits.

FLOPs = 2 x (parameters in matrix products) x tokens + attention (QK^T and AV: 4 x query width
(heads x head_dim) x queries x keys per layer, counted in full as eager PyTorch computes the
masked scores too).
Bytes per decoding step = the matrix weights (each read once; the embedding gather reads one
row and is left out) + the key/value cache read by attention.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import onnx
from torch import nn

from registry.catalog import Card
from registry.sizes import attention_sizes

ONNX_ITEM_BYTES = {onnx.TensorProto.FLOAT: 4.0, onnx.TensorProto.FLOAT16: 2.0,
                   onnx.TensorProto.UINT8: 1.0, onnx.TensorProto.INT8: 1.0,
                   onnx.TensorProto.INT4: 0.5, onnx.TensorProto.UINT4: 0.5}
MATMUL_OPS = {"MatMul", "Gemm", "MatMulNBits", "FusedMatMul"}


def linear_params(module: nn.Module | None) -> int:
    if module is None:
        return 0
    return sum(m.weight.numel() for m in module.modules() if isinstance(m, nn.Linear))


@dataclass
class Cost:
    card: Card
    layer_params: int  # matmul parameters per token in the (decoder) layers
    head_params: int  # vocabulary projection (tied or not)
    extra_params: int  # encoder: MLM transform; pooler counted separately
    encoder_layer_params: int = 0  # encoder-decoder: the source stack
    cross_kv_params: int = 0  # encoder-decoder: cross-attention key/value projections

    @property
    def d(self) -> int:
        return self.card["d_model"]

    @property
    def layers(self) -> int:
        return self.card["n_layers"]

    def attention(self, queries: int, keys: int) -> float:
        return 4.0 * attention_sizes(self.card).query_width * queries * keys * self.layers

    def decoder_forward(self, tokens: int, past: int, logit_tokens: int) -> float:
        """GPT-style: `tokens` new tokens after `past`, logits for `logit_tokens` of them."""
        return (2.0 * self.layer_params * tokens + 2.0 * self.head_params * logit_tokens
                + self.attention(tokens, past + tokens))

    def encoder_forward(self, batch: int, length: int) -> float:
        per_row = (2.0 * (self.layer_params + self.extra_params + self.head_params) * length
                   + 2.0 * self.d * self.d * bool(self.card["pooler"])
                   + self.attention(length, length))
        return batch * per_row

    def source_forward(self, batch: int, length: int) -> float:
        return batch * (2.0 * self.encoder_layer_params * length + self.attention(length, length))

    def cache_bytes(self, batch: int, keys: int) -> float:
        width = attention_sizes(self.card).kv_width
        return 2.0 * self.layers * keys * width * 4.0 * batch  # keys and values, fp32


def decoder_cost(model: nn.Module, card: Card) -> Cost:
    return Cost(card, linear_params(model.layers), card["vocab_size"] * card["d_model"], 0)


def encoder_cost(model: nn.Module, card: Card) -> Cost:
    mlm = getattr(model, "mlm_head", None)
    head = card["vocab_size"] * card["d_model"] if mlm is not None else 0
    return Cost(card, linear_params(model.layers), head, linear_params(mlm))


def seq2seq_cost(model: nn.Module, card: Card) -> Cost:
    cross_kv = sum(layer.cross_attention.key.weight.numel()
                   + layer.cross_attention.value.weight.numel()
                   for layer in model.decoder_layers)
    return Cost(card, linear_params(model.decoder_layers) - cross_kv,
                card["vocab_size"] * card["d_model"], 0, linear_params(model.encoder_layers),
                cross_kv)


def onnx_matmul_weight_bytes(path: Path) -> float:
    """Bytes of the constant weights every MatMul-like node reads (quantized blocks and their
    scales included), from the graph's metadata only: external data is not loaded."""
    model = onnx.load(str(path), load_external_data=False)
    sizes = {}
    for tensor in model.graph.initializer:
        count = 1
        for dim in tensor.dims:
            count *= dim
        sizes[tensor.name] = count * ONNX_ITEM_BYTES.get(tensor.data_type, 4.0)
    # A tied head reads the embedding through Transpose(W); count W there.
    alias = {node.output[0]: node.input[0] for node in model.graph.node
             if node.op_type == "Transpose" and node.input[0] in sizes}
    read: set[str] = set()
    for node in model.graph.node:
        if node.op_type in MATMUL_OPS:
            names = (alias.get(name, name) for name in node.input[1:])
            read.update(name for name in names if name in sizes)
    return float(sum(sizes[name] for name in read))
