"""LoRA (Hu et al. 2021): a low-rank update on a frozen linear layer, W x + s B A x, as an
option on any built model rather than a model of its own.

`add_adapters(model, targets, ...)` swaps each chosen nn.Linear for a `LoRALinear` that keeps
the same weight and bias (frozen; their state-dict names unchanged) and adds `lora_A` (r x in)
and `lora_B` (out x r). The targets are the zoo's own names of a block's linears, the last part
of the module's name: attention `query`, `key`, `value`, `out`; feed-forward `gate`, `up`,
`down` (`TARGETS`). A mixture of experts' experts are left out. As PEFT does: A is initialised
kaiming-uniform (a = sqrt 5), B with zeros, so the model starts as the base; dropout is on the
adapter's input; the scale s is alpha / r, or alpha / sqrt(r) with rsLoRA (Kalajdzievski 2023).
`merge_adapters` puts W + s B A back into plain nn.Linear layers (what an export carries).
An export that keeps its adapters apart (`zoo export --adapters keep`) traces each LoRALinear
with `fed` set: A and B come from outside (the graph's inputs), the scale folded into B.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

import torch
import torch.nn.functional as F
from torch import nn

from registry.errors import ZooError

TARGETS = ("query", "key", "value", "out", "gate", "up", "down")  # the zoo's linears' names
DEFAULT_TARGETS = ("query", "value")  # PEFT's default for Llama: q_proj, v_proj
DEFAULT_ALPHA = 8.0  # PEFT's LoraConfig default (lora_alpha=8)
LEFT_OUT = "experts"  # a module path through a mixture's experts is not a target


def scaling(rank: int, alpha: float, rslora: bool) -> float:
    return alpha / (math.sqrt(rank) if rslora else rank)


class LoRALinear(nn.Linear):
    """An nn.Linear (the base's own weight and bias, frozen) plus s * B(A(dropout(x)))."""

    def __init__(self, base: nn.Linear, rank: int, alpha: float, dropout: float = 0.0,
                 rslora: bool = False) -> None:
        nn.Module.__init__(self)
        self.in_features, self.out_features = base.in_features, base.out_features
        self.weight, self.bias = base.weight, base.bias
        for parameter in (self.weight, self.bias):
            if parameter is not None:
                parameter.requires_grad_(False)
        kinds = {"device": base.weight.device, "dtype": base.weight.dtype}
        self.lora_A = nn.Linear(self.in_features, rank, bias=False, **kinds)
        self.lora_B = nn.Linear(rank, self.out_features, bias=False, **kinds)
        nn.init.kaiming_uniform_(self.lora_A.weight, a=math.sqrt(5))
        nn.init.zeros_(self.lora_B.weight)
        self.lora_dropout = nn.Dropout(dropout) if dropout > 0 else nn.Identity()
        self.rank, self.alpha, self.rslora = rank, alpha, rslora
        self.scaling = scaling(rank, alpha, rslora)
        # (A (batch, in, r), B (batch, r, out), a row's each, the scale folded in): while set,
        # they replace lora_A and lora_B (export/onnx/kept_adapters.py traces with them)
        self.fed: tuple[torch.Tensor, torch.Tensor] | None = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.fed is not None:
            fed_a, fed_b = self.fed
            return F.linear(x, self.weight, self.bias) + (x @ fed_a) @ fed_b
        update = self.lora_B(self.lora_A(self.lora_dropout(x)))
        return F.linear(x, self.weight, self.bias) + update * self.scaling

    def merged(self) -> nn.Linear:
        """A plain nn.Linear computing W + s B A (and the bias)."""
        linear = nn.Linear(self.in_features, self.out_features, bias=self.bias is not None,
                           device=self.weight.device, dtype=self.weight.dtype)
        with torch.no_grad():
            delta = (self.lora_B.weight.float() @ self.lora_A.weight.float()) * self.scaling
            linear.weight.copy_((self.weight.float() + delta).to(self.weight.dtype))
            if self.bias is not None:
                linear.bias.copy_(self.bias)
        return linear


def _parent(model: nn.Module, name: str) -> tuple[nn.Module, str]:
    path, _, leaf = name.rpartition(".")
    return (model.get_submodule(path) if path else model), leaf


def targeted(model: nn.Module, targets: Iterable[str]) -> list[str]:
    """The names of the linears `targets` choose (experts left out), in the model's order."""
    wanted = set(targets)
    return [name for name, module in model.named_modules()
            if type(module) is nn.Linear and name.rpartition(".")[2] in wanted
            and LEFT_OUT not in name.split(".")]


def check_targets(model: nn.Module, targets: Iterable[str], rank: int, where: str) -> list[str]:
    """The linears chosen, after one-line refusals: a rank below 1 or above a layer's
    smaller side, a target that is none of the zoo's names or matches no linear here."""
    targets = list(targets)
    if rank < 1:
        raise ZooError(f"{where}: --lora {rank}: the rank should be >= 1")
    if not targets:
        raise ZooError(f"{where}: --lora-targets: name at least one of {', '.join(TARGETS)}")
    for target in targets:
        if target not in TARGETS:
            raise ZooError(f"{where}: --lora-targets {target}: not a linear's name in the zoo "
                           f"(known: {', '.join(TARGETS)})")
        if not targeted(model, [target]):
            present = [t for t in TARGETS if targeted(model, [t])]
            raise ZooError(f"{where}: --lora-targets {target}: matches no linear of this model "
                           f"(it has: {', '.join(present)})")
    names = targeted(model, targets)
    for name in names:
        layer = model.get_submodule(name)
        if rank > min(layer.in_features, layer.out_features):
            raise ZooError(f"{where}: --lora {rank}: larger than {name} "
                           f"({layer.in_features} -> {layer.out_features}) allows "
                           f"(at most {min(layer.in_features, layer.out_features)})")
    return names


def add_adapters(model: nn.Module, targets: Iterable[str], rank: int, alpha: float,
                 dropout: float = 0.0, rslora: bool = False, where: str = "model"
                 ) -> list[str]:
    """Freeze `model` and give each chosen linear an adapter; returns their names."""
    names = check_targets(model, targets, rank, where)
    for parameter in model.parameters():
        parameter.requires_grad_(False)
    for name in names:
        parent, leaf = _parent(model, name)
        setattr(parent, leaf, LoRALinear(getattr(parent, leaf), rank, alpha, dropout, rslora))
    return names


def adapters(model: nn.Module) -> dict[str, LoRALinear]:
    return {name: module for name, module in model.named_modules()
            if isinstance(module, LoRALinear)}


def base_state(model: nn.Module) -> dict[str, torch.Tensor]:
    """The state dict without the adapters' factors: the base's own tensors, as it came."""
    return {name: tensor.detach().contiguous().cpu() for name, tensor in
            model.state_dict().items()
            if not any(f".{part}." in name for part in ("lora_A", "lora_B"))}


def merge_adapters(model: nn.Module) -> nn.Module:
    """Each LoRALinear replaced by the plain nn.Linear it computes; the model unfrozen."""
    for name, module in adapters(model).items():
        parent, leaf = _parent(model, name)
        setattr(parent, leaf, module.merged())
    for parameter in model.parameters():
        parameter.requires_grad_(True)
    return model
