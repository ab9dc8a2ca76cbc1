"""PyTorch behind the same interface as `Runtime` (runtime/engine.Engine): each graph file is
the family's flat-signature wrapper, fed and read by the contract's names."""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

from export.family import Family
from registry.catalog import Card


class TorchEngine:
    def __init__(self, model: nn.Module, card: Card, family: Family, device: str = "cpu",
                 attentions: bool = False) -> None:
        """Opened through export/opening.py's open_model, which resolves the family."""
        self.card = card
        self.device = torch.device(device)
        model = model.eval().to(self.device)
        self.dtype = next(model.parameters()).dtype
        self.family = family
        self.spec = family.spec
        self.graphs = self.family.wrappers(model, card, attentions)
        self.contract = self.family.contract(card, attentions)

    def run(self, file: str, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        inputs, outputs = self.contract[file]
        tensors = [torch.from_numpy(np.ascontiguousarray(feeds[name])).to(self.device)
                   for name in inputs]
        tensors = [tensor.to(self.dtype) if tensor.is_floating_point() else tensor
                   for tensor in tensors]  # a float16 model takes its cache in float16
        past_at = next((i for i, name in enumerate(inputs) if name.startswith("past_")), None)
        args = tensors if past_at is None else [*tensors[:past_at], tuple(tensors[past_at:])]
        with torch.no_grad():
            result = self.graphs[file](*args)
        if isinstance(result, torch.Tensor):
            result = (result,)
        return {name: tensor.float().cpu().numpy() if tensor.is_floating_point()
                else tensor.cpu().numpy() for name, tensor in zip(outputs, result, strict=True)}
