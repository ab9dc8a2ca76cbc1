"""Output heads: the LM head (tied to the token embedding or not), the MLM head, the pooler,
the sentence vector (a pooling over the hidden states) and the classifier on it.

Each head declares the graph output it adds (`graph_output`), here and nowhere else: the ONNX
contract, parity and the runtimes read the names from these declarations. An encoder's optional
heads are listed in ENCODER_HEADS; `register_head` adds one (a plugin's, or a test's) without
touching the encoder, the build or the exporter.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from registry.errors import ZooError
from zoo.blocks.feedforward import gelu_erf


@dataclass
class HeadInputs:
    """What an encoder head may read besides the final hidden states."""

    attention_mask: torch.Tensor | None  # (B, T), 1 for real tokens
    token_embedding: torch.Tensor | None  # (vocab, d), for heads tied to it (None: pixels in)
    outputs: dict[str, torch.Tensor] = field(default_factory=dict)  # earlier heads' outputs


class LMHead(nn.Module):
    """Hidden states to vocabulary logits. Tied, it uses the embedding matrix it is handed at
    call time instead of holding a second reference, so the weight is stored once. `scale`
    multiplies the states first (T5's tied head: d_model^-0.5)."""

    graph_output = "logits"

    def __init__(self, d_model: int, vocab_size: int, tied: bool, bias: bool = False,
                 softcap: float | None = None, scale: float = 1.0) -> None:
        super().__init__()
        self.weight = None if tied else nn.Parameter(torch.empty(vocab_size, d_model))
        self.bias = nn.Parameter(torch.zeros(vocab_size)) if bias else None
        self.softcap = softcap  # Gemma 2's: logits capped as softcap * tanh(logits / softcap)
        self.scale = scale  # T5's d_model^-0.5 on the states before its tied head

    def forward(self, x: torch.Tensor, embedding_weight: torch.Tensor) -> torch.Tensor:
        weight = embedding_weight if self.weight is None else self.weight
        if self.scale != 1.0:
            x = x * self.scale
        logits = F.linear(x, weight, self.bias)
        if self.softcap is None:
            return logits
        return torch.tanh(logits / self.softcap) * self.softcap


class MLMHead(nn.Module):
    """BERT's masked-LM head: dense, GELU, norm, then vocabulary logits with their own bias."""

    graph_output = "logits"

    def __init__(self, d_model: int, vocab_size: int, norm: nn.Module, tied: bool,
                 transform_bias: bool = True) -> None:
        super().__init__()
        self.transform = nn.Linear(d_model, d_model, bias=transform_bias)
        self.norm = norm
        self.output = LMHead(d_model, vocab_size, tied, bias=True)

    def forward(self, x: torch.Tensor, inputs: HeadInputs) -> torch.Tensor:
        return self.output(self.norm(gelu_erf(self.transform(x))), inputs.token_embedding)


class Pooler(nn.Module):
    """tanh(W h_0 + b): the first token's state as a sentence vector (BERT)."""

    graph_output = "pooler_output"

    def __init__(self, d_model: int) -> None:
        super().__init__()
        self.dense = nn.Linear(d_model, d_model)

    def forward(self, x: torch.Tensor, inputs: HeadInputs) -> torch.Tensor:
        return torch.tanh(self.dense(x[:, 0]))


def _real_token(mask: torch.Tensor, last: bool) -> torch.Tensor:
    """(B,) index of each row's first (or last) real token, wherever the padding is: the
    argmax of the mask weighted by distance from the other end is unique."""
    length = mask.shape[1]
    steps = torch.arange(length, device=mask.device)
    weights = steps + 1 if last else length - steps
    return (mask.long() * weights).argmax(dim=1)


class SentenceEmbedding(nn.Module):
    """One vector per row (B, D) from the hidden states, by the card's `pooling`: `cls` the
    first real token, `last` the last real token, `mean` the average over real tokens only
    (sentence-transformers' formula), `pooler` BERT's pooler output; then, with `normalize`,
    scaled to unit length (F.normalize, as sentence-transformers' Normalize module)."""

    graph_output = "sentence_embedding"

    def __init__(self, pooling: str, normalize: bool) -> None:
        super().__init__()
        self.pooling, self.normalize = pooling, normalize

    def forward(self, x: torch.Tensor, inputs: HeadInputs) -> torch.Tensor:
        mask = inputs.attention_mask
        if mask is None:
            mask = torch.ones(x.shape[:2], dtype=torch.long, device=x.device)
        if self.pooling == "pooler":
            pooled = inputs.outputs[Pooler.graph_output]
        elif self.pooling == "mean":
            weights = mask.to(x.dtype).unsqueeze(-1)
            pooled = (x * weights).sum(dim=1) / weights.sum(dim=1).clamp(min=1e-9)
        else:
            index = _real_token(mask, last=self.pooling == "last")
            pooled = x.gather(1, index[:, None, None].expand(-1, 1, x.shape[-1])).squeeze(1)
        return F.normalize(pooled, p=2.0, dim=-1) if self.normalize else pooled


class Classifier(nn.Module):
    """Dropout and a linear layer on the sentence vector: (B, num_labels) class scores. Given a
    `norm`, the vector goes through dense, GELU and that norm first (ModernBERT's head,
    `classifier_transform`), the dense with a bias where `transform_bias`."""

    graph_output = "logits"

    def __init__(self, d_model: int, num_labels: int, dropout: float,
                 norm: nn.Module | None = None, transform_bias: bool = True) -> None:
        super().__init__()
        self.transform = None if norm is None else nn.Linear(d_model, d_model,
                                                             bias=transform_bias)
        self.norm = norm
        self.dropout = nn.Dropout(dropout)
        self.linear = nn.Linear(d_model, num_labels)

    def forward(self, x: torch.Tensor, inputs: HeadInputs) -> torch.Tensor:
        vector = inputs.outputs[SentenceEmbedding.graph_output]
        if self.transform is not None:
            vector = self.norm(gelu_erf(self.transform(vector)))
        return self.linear(self.dropout(vector))


@dataclass(frozen=True)
class HeadSpec:
    """An optional encoder head: the module name (its weights' prefix), its class (which
    declares `graph_output`), whether a card has it, and how to build it (`parts` is
    zoo.assemble.Parts: norms and the like for this card)."""

    name: str
    head: type[nn.Module]
    enabled: Callable[[dict[str, Any]], bool]
    build: Callable[[dict[str, Any], Any], nn.Module]


# The heads on a sentence vector, in output order: the encoder's last ones, and the decoder's
# only ones when its card has a pooling (a decoder classifier or embedder).
SEQUENCE_HEADS: list[HeadSpec] = [
    HeadSpec("pooling", SentenceEmbedding, lambda card: card["pooling"] is not None,
             lambda card, parts: SentenceEmbedding(card["pooling"], card["normalize"])),
    HeadSpec("classifier", Classifier, lambda card: card["num_labels"] > 0,
             lambda card, parts: Classifier(
                 card["d_model"], card["num_labels"], card["dropout"],
                 parts.norm() if card["classifier_transform"] else None, card["head_bias"])),
]
ENCODER_HEADS: list[HeadSpec] = [
    HeadSpec("pooler", Pooler, lambda card: card["pooler"],
             lambda card, parts: Pooler(card["d_model"])),
    HeadSpec("mlm_head", MLMHead, lambda card: card["mlm_head"],
             lambda card, parts: MLMHead(card["d_model"], card["vocab_size"], parts.norm(),
                                         card["tie_embeddings"], card["head_bias"])),
    *SEQUENCE_HEADS,
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


def sequence_heads(card: dict[str, Any]) -> list[HeadSpec]:
    """The heads a decoder card with a pooling has, in output order."""
    return [spec for spec in SEQUENCE_HEADS if spec.enabled(card)]


def run_heads(model: nn.Module, names: list[str], x: torch.Tensor, inputs: HeadInputs
              ) -> dict[str, torch.Tensor]:
    """{"last_hidden_state": x, then each named head's graph output}: later heads read the
    earlier ones' outputs (the classifier reads the sentence vector)."""
    inputs.outputs["last_hidden_state"] = x
    for name in names:
        head = getattr(model, name)
        inputs.outputs[head.graph_output] = head(x, inputs)
    return inputs.outputs
