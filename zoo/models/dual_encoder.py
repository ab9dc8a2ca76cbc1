"""A dual encoder (CLIP, Radford et al. 2021; SigLIP, Zhai et al. 2023; registry/dual.py): a
text tower (token embeddings and encoder layers, causal for CLIP) and an image tower (the patch
stem and encoder layers), each pooled to one vector and projected into a joint space where an
image and a text are compared by their cosine times exp(logit_scale), plus logit_bias.

The outputs are named as transformers' CLIPModel names them: `encode_text` is
CLIPTextModelWithProjection's (text_embeds, last_hidden_state), `encode_image`
CLIPVisionModelWithProjection's, `forward` CLIPModel's (logits_per_image, logits_per_text and
the unit-length embeddings).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from zoo.blocks.layer import Layer
from zoo.models.encoder import Encoder
from zoo.models.sequence import run_sequence


class TextTower(Encoder):
    """The encoder with no heads, its states pooled at the first end token (`eos`: CLIP's
    CLIPTextTransformer with a corrected eos_token_id) or the last position (`last`: SigLIP's,
    whose texts are padded to a fixed length)."""

    def __init__(self, embeddings: nn.Module, layers: list[Layer], final_norm: nn.Module | None,
                 pooling: str, eos_token_id: int | None, causal: bool) -> None:
        super().__init__(embeddings, layers, final_norm, {})
        self.pooling, self.eos_token_id, self.causal = pooling, eos_token_id, causal

    def forward(self, input_ids: torch.Tensor,  # type: ignore[override]
                attention_mask: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """(last_hidden_state (B, T, d), pooled (B, d))."""
        states = run_sequence(self, input_ids, attention_mask, causal=self.causal)
        x = states["last_hidden_state"]
        if self.pooling == "last":
            return x, x[:, -1]
        # argmax finds the first maximum: the first end token of each row
        first_end = (input_ids == self.eos_token_id).to(torch.int32).argmax(dim=-1)
        return x, x[torch.arange(x.shape[0], device=x.device), first_end]


class ProbeHead(nn.Module):
    """SigLIP's multi-head attention pooling (MAP): a learned probe attends over the states,
    then a norm and a feed-forward with a residual (transformers'
    SiglipMultiheadAttentionPoolingHead: its tensor names and shapes)."""

    def __init__(self, d_model: int, n_heads: int, norm: nn.Module, feed_forward: nn.Module
                 ) -> None:
        super().__init__()
        self.probe = nn.Parameter(torch.randn(1, 1, d_model) * 0.02)
        self.attention = nn.MultiheadAttention(d_model, n_heads, batch_first=True)
        self.layernorm = norm
        self.mlp = feed_forward

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        probe = self.probe.expand(x.shape[0], -1, -1)
        pooled = self.attention(probe, x, x, need_weights=False)[0]
        return (pooled + self.mlp(self.layernorm(pooled)))[:, 0]


class VisionTower(nn.Module):
    """The patch stem and encoder layers; `cls`: the class token's state through the final
    norm, the states themselves unnormed (CLIP's post_layernorm); `map`: every state through
    the final norm, pooled by the probe (SigLIP's)."""

    def __init__(self, embeddings: nn.Module, layers: list[Layer], final_norm: nn.Module,
                 head: ProbeHead | None) -> None:
        super().__init__()
        self.embeddings = embeddings
        self.layers = nn.ModuleList(layers)
        self.final_norm = final_norm
        self.head = head

    def forward(self, pixel_values: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(last_hidden_state (B, [1 +] patches, d), pooled (B, d))."""
        x = self.embeddings(pixel_values)
        for layer in self.layers:
            x, _ = layer(x, None)
        if self.head is None:
            return x, self.final_norm(x[:, 0])
        x = self.final_norm(x)
        return x, self.head(x)


class DualEncoder(nn.Module):
    def __init__(self, text: TextTower, vision: VisionTower, text_projection: nn.Linear,
                 vision_projection: nn.Linear | None, logit_scale: float,
                 logit_bias: float | None) -> None:
        super().__init__()
        self.text, self.vision = text, vision
        self.text_projection, self.vision_projection = text_projection, vision_projection
        self.logit_scale = nn.Parameter(torch.tensor([logit_scale]))
        self.logit_bias = (nn.Parameter(torch.tensor([logit_bias])) if logit_bias is not None
                           else None)

    def attention_groups(self) -> dict[str, list[nn.Module]]:
        return {"text_attentions": [layer.self_attention for layer in self.text.layers],
                "vision_attentions": [layer.self_attention for layer in self.vision.layers]}

    def encode_text(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None
                    ) -> dict[str, torch.Tensor]:
        states, pooled = self.text(input_ids, attention_mask)
        return {"text_embeds": self.text_projection(pooled), "last_hidden_state": states}

    def encode_image(self, pixel_values: torch.Tensor) -> dict[str, torch.Tensor]:
        states, pooled = self.vision(pixel_values)
        embeds = pooled if self.vision_projection is None else self.vision_projection(pooled)
        return {"image_embeds": embeds, "last_hidden_state": states}

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None,
                pixel_values: torch.Tensor) -> dict[str, torch.Tensor]:
        """Each image against each text: logits_per_image (images, texts), its transpose, and
        the unit-length embeddings the logits compare."""
        text = F.normalize(self.encode_text(input_ids, attention_mask)["text_embeds"], dim=-1)
        image = F.normalize(self.encode_image(pixel_values)["image_embeds"], dim=-1)
        logits_per_text = text @ image.t() * self.logit_scale.exp()
        if self.logit_bias is not None:
            logits_per_text = logits_per_text + self.logit_bias
        return {"logits_per_image": logits_per_text.t(), "logits_per_text": logits_per_text,
                "text_embeds": text, "image_embeds": image}
