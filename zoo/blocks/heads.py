"""Output heads: the LM head (tied to the token embedding or not), the MLM head, the pooler.

Each head declares the graph output it adds (`graph_output`), here and nowhere else: the ONNX
contract, parity and the runtimes read the names from these declarations. An encoder's optional
heads are listed in ENCODER_HEADS; `register_head` adds one (a plugin's, or a test's) without
touching the encoder, the build or the exporter.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from registry.errors import ZooError


@dataclass
class HeadInputs:
    """What an encoder head may read besides the final hidden states."""

    attention_mask: torch.Tensor | None  # (B, T), 1 for real tokens
    token_embedding: torch.Tensor  # (vocab, d), for heads tied to it


class LMHead(nn.Module):
    """Hidden states to vocabulary logits. Tied, it uses the embedding matrix it is handed at
    call time instead of holding a second reference, so the weight is stored once."""

    graph_output = "logits"

    def __init__(self, d_model: int, vocab_size: int, tied: bool, bias: bool = False) -> None:
        super().__init__()
        self.weight = None if tied else nn.Parameter(torch.empty(vocab_size, d_model))
        self.bias = nn.Parameter(torch.zeros(vocab_size)) if bias else None

    def forward(self, x: torch.Tensor, embedding_weight: torch.Tensor) -> torch.Tensor:
        weight = embedding_weight if self.weight is None else self.weight
        return F.linear(x, weight, self.bias)


class MLMHead(nn.Module):
    """BERT's masked-LM head: dense, GELU, norm, then vocabulary logits with their own bias."""

    graph_output = "logits"

    def __init__(self, d_model: int, vocab_size: int, norm: nn.Module, tied: bool) -> None:
        super().__init__()
        self.transform = nn.Linear(d_model, d_model)
        self.norm = norm
        self.output = LMHead(d_model, vocab_size, tied, bias=True)

    def forward(self, x: torch.Tensor, inputs: HeadInputs) -> torch.Tensor:
        return self.output(self.norm(F.gelu(self.transform(x))), inputs.token_embedding)


class Pooler(nn.Module):
    """tanh(W h_0 + b): the first token's state as a sentence vector (BERT)."""

    graph_output = "pooler_output"

    def __init__(self, d_model: int) -> None:
        super().__init__()
        self.dense = nn.Linear(d_model, d_model)

    def forward(self, x: torch.Tensor, inputs: HeadInputs) -> torch.Tensor:
        return torch.tanh(self.dense(x[:, 0]))


@dataclass(frozen=True)
class HeadSpec:
    """An optional encoder head: the module name (its weights' prefix), its class (which
    declares `graph_output`), whether a card has it, and how to build it (`parts` is
    zoo.build.Parts: norms and the like for this card)."""

    name: str
    head: type[nn.Module]
    enabled: Callable[[dict[str, Any]], bool]
    build: Callable[[dict[str, Any], Any], nn.Module]


ENCODER_HEADS: list[HeadSpec] = [
    HeadSpec("pooler", Pooler, lambda card: card["pooler"],
             lambda card, parts: Pooler(card["d_model"])),
    HeadSpec("mlm_head", MLMHead, lambda card: card["mlm_head"],
             lambda card, parts: MLMHead(card["d_model"], card["vocab_size"], parts.norm(),
                                         card["tie_embeddings"])),
]


def register_head(spec: HeadSpec) -> None:
    """Add an encoder head after the built-in ones; one name twice is an error."""
    if any(existing.name == spec.name for existing in ENCODER_HEADS):
        raise ZooError(f"encoder head '{spec.name}' is already registered")
    ENCODER_HEADS.append(spec)


def unregister_head(name: str) -> None:
    ENCODER_HEADS[:] = [spec for spec in ENCODER_HEADS if spec.name != name]


def encoder_heads(card: dict[str, Any]) -> list[HeadSpec]:
    """The optional heads a card's encoder has, in output order."""
    return [spec for spec in ENCODER_HEADS if spec.enabled(card)]
