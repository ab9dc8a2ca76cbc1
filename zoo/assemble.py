"""The one place a validated card becomes an nn.Module: parts are built here and passed in."""

from __future__ import annotations

import contextlib
from typing import Any

import torch
from torch import nn

from registry.catalog import Card
from registry.dual import DUAL
from registry.schema import shared_embeddings, target_vocab_size
from registry.stems import is_mel_card, is_patch_card
from zoo.blocks.classes import build_block
from zoo.blocks.embeddings import Embeddings
from zoo.blocks.heads import LMHead, encoder_heads, sequence_heads
from zoo.blocks.layer import Layer
from zoo.blocks.windows import LocalAttention
from zoo.models.decoder import Decoder
from zoo.models.dual_encoder import DualEncoder, ProbeHead, TextTower, VisionTower
from zoo.models.encoder import Encoder
from zoo.models.encoder_decoder import EncoderDecoder
from zoo.models.image_encoder import ImageEncoder
from zoo.models.speech import SpeechEncoderDecoder

INIT_STD = 0.02


class Parts:
    """Factories for one card's blocks, so the family wiring below reads as plain assembly.
    Every block is built from the card (and its layer index) by the block itself."""

    def __init__(self, card: dict[str, Any]) -> None:
        self.card = card

    def norm(self) -> nn.Module:
        return build_block("norm", self.card, None)

    def layers(self, cross: bool = False) -> list[Layer]:
        return [Layer.from_card(self.card, index, cross) for index in range(self.card["n_layers"])]

    def final_norm(self) -> nn.Module | None:
        return self.norm() if self.card["final_norm"] else None

    def embeddings(self, position: nn.Module, vocab_size: int | None = None) -> Embeddings:
        c = self.card
        return Embeddings(
            vocab_size or c["vocab_size"], c["d_model"], position, c["dropout"],
            scale=c["scale_embeddings"],
            type_vocab_size=c["type_vocab_size"],
            norm=self.norm() if c["embedding_norm"] else None,
        )

    def position(self) -> nn.Module:
        return build_block("position", self.card, None)

    def decoder_position(self, position: nn.Module) -> nn.Module | None:
        """The decoder stack's own position block where the block is one per stack (T5's
        causal bias table beside the encoder's bidirectional one); None: it shares `position`."""
        if not getattr(position, "per_stack", False):
            return None
        return build_block("position", self.card, None, causal=True)

    def lm_head(self, vocab_size: int | None = None) -> LMHead:
        c = self.card
        return LMHead(c["d_model"], vocab_size or c["vocab_size"], tied=c["tie_embeddings"],
                      bias=c["output_bias"], softcap=c["final_logit_softcapping"],
                      scale=c["d_model"] ** -0.5 if c["head_scale"] else 1.0)


def _dual_encoder(card: dict[str, Any]) -> DualEncoder:
    """CLIP or SigLIP: the text tower from the card's own fields, the image tower from its
    `vision` card, each of the blocks the other families use."""
    text, vision = Parts(card), Parts(card["vision"])
    head = None
    if card["vision_pooling"] == "map":
        v = card["vision"]
        head = ProbeHead(v["d_model"], v["n_heads"], vision.norm(),
                         build_block("activation", v, None))
    dim, bias = card["projection_dim"], card["projection_bias"]
    return DualEncoder(
        TextTower(text.embeddings(text.position()), text.layers(), text.final_norm(),
                  card["pooling"], card["eos_token_id"], card["causal"]),
        VisionTower(build_block("stem", card["vision"], None), vision.layers(), vision.norm(),
                    head),
        nn.Linear(card["d_model"], dim, bias=bias),
        nn.Linear(card["vision"]["d_model"], dim, bias=bias) if card["vision_projection"]
        else None,
        card["logit_scale"], card["logit_bias"])


def _assemble(card: dict[str, Any]) -> nn.Module:
    parts = Parts(card)
    family = card["family"]
    if family == DUAL:
        return _dual_encoder(card)
    if family == "decoder":  # with a pooling: a sequence model, its heads instead of the LM's
        sequence = {spec.name: spec.build(card, parts) for spec in sequence_heads(card)}
        return Decoder(parts.embeddings(parts.position()), parts.layers(), parts.final_norm(),
                       None if sequence else parts.lm_head(), sequence,
                       LocalAttention.from_card(card))
    if family == "encoder" and is_patch_card(card):  # a ViT: the stem reads pixels
        heads = {spec.name: spec.build(card, parts) for spec in encoder_heads(card)}
        return ImageEncoder(build_block("stem", card, None), parts.layers(), parts.final_norm(),
                            heads)
    if family == "encoder":
        embeddings, layers, final_norm = (parts.embeddings(parts.position()), parts.layers(),
                                          parts.final_norm())
        heads = {spec.name: spec.build(card, parts) for spec in encoder_heads(card)}
        return Encoder(embeddings, layers, final_norm, heads, LocalAttention.from_card(card))
    if is_mel_card(card):  # Whisper: the source is audio frames, the target tokens
        return SpeechEncoderDecoder(
            build_block("stem", card, None), parts.embeddings(parts.position()),
            parts.layers(), parts.layers(cross=True), parts.final_norm(), parts.final_norm(),
            parts.lm_head())
    position = parts.position()  # shared by both stacks: a function of position only
    target = target_vocab_size(card)
    # One matrix for source, target and output, unless untied or the vocabularies differ
    # (then the output head, if tied, uses the target embedding); T5 v1.1 shares the source's
    # with the target, not with its head (share_embeddings).
    shared = shared_embeddings(card)
    return EncoderDecoder(
        parts.embeddings(position),
        None if shared else parts.embeddings(position, target),
        parts.layers(),
        parts.layers(cross=True),
        parts.final_norm(),
        parts.final_norm(),
        parts.lm_head(target),
        parts.decoder_position(position),
    )


def _initialise(model: nn.Module, card: dict[str, Any]) -> None:
    """Small normal weights and zero biases for the layers this file builds; norms keep their
    unit init, and blocks from plugins keep whatever init they chose.

    Scaled embeddings start at d_model^-0.5, so that after the sqrt(d_model) scale they are of
    unit size (Vaswani et al. 2017).
    """
    embedding_std = card["d_model"] ** -0.5 if card["scale_embeddings"] else INIT_STD
    for name, module in model.named_modules():
        if isinstance(module, nn.Linear):
            nn.init.normal_(module.weight, std=INIT_STD)
            if module.bias is not None:
                nn.init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            std = embedding_std if name.endswith("embeddings.token") else INIT_STD
            nn.init.normal_(module.weight, std=std)
        elif isinstance(module, LMHead):
            if module.weight is not None:
                nn.init.normal_(module.weight, std=INIT_STD)
            if module.bias is not None:
                nn.init.zeros_(module.bias)


def build_model(card: Card | dict[str, Any], seed: int | None = 0, meta: bool = False) -> nn.Module:
    """Build the module for `card`, initialised from `seed`, in eval mode.

    `seed=None` skips our initialisation, for modules whose weights are loaded next.
    `meta=True` builds on the meta device (no memory), for counting full-size cards.
    """
    fields = card.fields if isinstance(card, Card) else card
    device = torch.device("meta") if meta else contextlib.nullcontext()
    with device:
        if seed is not None and not meta:
            torch.manual_seed(seed)
        model = _assemble(fields)
        if seed is not None and not meta:
            _initialise(model, fields)
    return model.eval()
