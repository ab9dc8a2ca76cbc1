"""PyTorch behind the same interface as `Runtime`: `run(file, feeds) -> {output: array}`.

Parity and generation are written once against this interface, so the code that compares
PyTorch with ONNX Runtime drives both through exactly the same steps.
"""

from __future__ import annotations

from typing import Protocol

import numpy as np
import torch
from torch import nn

from export.contract import files_for
from export.graphs import DecoderGraph, EncoderGraph, SourceEncoderGraph, TargetDecoderGraph
from registry.catalog import Card


class Engine(Protocol):
    card: Card

    def run(self, file: str, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]: ...


class TorchEngine:
    def __init__(self, model: nn.Module, card: Card, device: str = "cpu") -> None:
        self.card = card
        self.device = torch.device(device)
        model = model.eval().to(self.device)
        if card.family == "decoder":
            graphs = {"model.onnx": DecoderGraph(model)}
        elif card.family == "encoder":
            graphs = {"model.onnx": EncoderGraph(model, bool(card["type_vocab_size"]))}
        else:
            graphs = {"encoder.onnx": SourceEncoderGraph(model),
                      "decoder.onnx": TargetDecoderGraph(model)}
        self.graphs = graphs
        self.contract = files_for(card.fields)

    def run(self, file: str, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        inputs, outputs = self.contract[file]
        tensors = [torch.from_numpy(np.ascontiguousarray(feeds[name])).to(self.device)
                   for name in inputs]
        past_at = next((i for i, name in enumerate(inputs) if name.startswith("past_")), None)
        args = tensors if past_at is None else [*tensors[:past_at], tuple(tensors[past_at:])]
        with torch.no_grad():
            result = self.graphs[file](*args)
        if isinstance(result, torch.Tensor):
            result = (result,)
        return {name: tensor.float().cpu().numpy() if tensor.is_floating_point()
                else tensor.cpu().numpy() for name, tensor in zip(outputs, result, strict=True)}
