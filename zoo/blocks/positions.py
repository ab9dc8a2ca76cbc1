"""Positional encodings: `Position(d_model, max_positions, head_dim, theta)`, and from a card
`Position.from_card(card, layer)`. Each offers two hooks: `add` (to the embeddings) and
`rotary` (cos/sin for attention, or None); a position may offer a third,
`attention_bias(query_length, key_length)`: a float bias (1|B, heads, T, S) on every
self-attention's scores (ALiBi's), added to the mask once per forward
(zoo/blocks/attention.py: `with_position_bias`)."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import torch
from torch import nn

from registry.sizes import attention_sizes

Rotary = tuple[torch.Tensor, torch.Tensor]


class CardPosition:
    """What the positions read of a card, and how they are built from it."""

    reads: tuple[str, ...] = ("d_model", "max_positions")

    @classmethod
    def from_card(cls, card: Mapping[str, Any], layer: int | None) -> nn.Module:
        return cls(card["d_model"], card["max_positions"], 0, 0.0)


def sinusoid_table(max_positions: int, d_model: int) -> torch.Tensor:
    """PE(pos, 2i) = sin(pos / 10000^(2i/d)), PE(pos, 2i+1) = cos(pos / 10000^(2i/d))."""
    position = torch.arange(max_positions, dtype=torch.float64)[:, None]
    two_i = torch.arange(0, d_model, 2, dtype=torch.float64)
    angle = position / torch.pow(10000.0, two_i / d_model)  # (P, ceil(d/2))
    table = torch.zeros(max_positions, d_model, dtype=torch.float64)
    table[:, 0::2] = torch.sin(angle)
    table[:, 1::2] = torch.cos(angle[:, : d_model // 2])
    return table.float()


def halves_table(max_positions: int, d_model: int) -> torch.Tensor:
    """The same frequencies, sines in the first ceil(d/2) columns and cosines after them
    (MarianMT's, from Marian NMT)."""
    table = sinusoid_table(max_positions, d_model)
    return torch.cat([table[:, 0::2], table[:, 1::2]], dim=1)


class Sinusoidal(CardPosition, nn.Module):
    """Fixed sinusoids (Vaswani et al. 2017); a buffer, not a weight, so never saved."""

    make_table = staticmethod(sinusoid_table)

    def __init__(self, d_model: int, max_positions: int, head_dim: int, theta: float) -> None:
        super().__init__()
        self.register_buffer("table", self.make_table(max_positions, d_model), persistent=False)

    def add(self, x: torch.Tensor, position_ids: torch.Tensor) -> torch.Tensor:
        return x + self.table[position_ids]

    def rotary(self, position_ids: torch.Tensor) -> Rotary | None:
        return None


class SinusoidalHalves(Sinusoidal):
    """The sinusoids laid out in halves instead of interleaved (`halves_table`)."""

    make_table = staticmethod(halves_table)


class Learned(CardPosition, nn.Module):
    """A learned table of absolute positions (BERT, GPT-2)."""

    def __init__(self, d_model: int, max_positions: int, head_dim: int, theta: float) -> None:
        super().__init__()
        self.table = nn.Embedding(max_positions, d_model)

    def add(self, x: torch.Tensor, position_ids: torch.Tensor) -> torch.Tensor:
        return x + self.table(position_ids)

    def rotary(self, position_ids: torch.Tensor) -> Rotary | None:
        return None


class RotaryPositions(nn.Module):
    """Rotary embeddings (Su et al. 2021): queries and keys rotated by position, in attention.
    `scaling` (the card's rope_scaling) stretches the frequencies for longer contexts."""

    reads = ("d_model", "max_positions", "n_heads", "n_kv_heads", "head_dim", "rope_theta",
             "rope_scaling")

    @classmethod
    def from_card(cls, card: Mapping[str, Any], layer: int | None) -> RotaryPositions:
        scaling = {"scaling": card["rope_scaling"]} if card["rope_scaling"] is not None else {}
        return cls(card["d_model"], card["max_positions"], attention_sizes(card).head_dim,
                   card["rope_theta"], **scaling)

    def __init__(self, d_model: int, max_positions: int, head_dim: int, theta: float,
                 scaling: dict[str, Any] | None = None) -> None:
        super().__init__()
        inv_freq = scaled_frequencies(base_frequencies(head_dim, theta), scaling, head_dim, theta)
        self.register_buffer("inv_freq", inv_freq, persistent=False)
        self.attention_scale = yarn_attention_factor(scaling)  # cos and sin scaled by it

    def _apply(self, fn: Any, recurse: bool = True) -> RotaryPositions:
        """Moves with the model but stays float32 when the model becomes float16 (as
        transformers computes its rotary angles): a frequency rounded to float16 is an angle
        error that grows with the position."""
        frequencies = self.inv_freq
        super()._apply(fn, recurse)
        self.inv_freq = frequencies.to(self.inv_freq.device)
        return self

    def add(self, x: torch.Tensor, position_ids: torch.Tensor) -> torch.Tensor:
        return x

    def rotary(self, position_ids: torch.Tensor) -> Rotary | None:
        angle = position_ids[..., None].float() * self.inv_freq  # (B, T, hd/2)
        angle = torch.cat([angle, angle], dim=-1)[:, None]  # (B, 1, T, hd)
        if self.attention_scale == 1.0:
            return angle.cos(), angle.sin()
        return angle.cos() * self.attention_scale, angle.sin() * self.attention_scale


# The frequencies are computed in float32 with transformers' operations in transformers'
# order (modeling_rope_utils), so they are its bits: computed in float64 and rounded once
# they differed by an ulp, and an ulp of a frequency is a growing angle error down the
# positions (4e-4 in a tiny OLMoE's logits at position 300 with rope_theta 500).

def base_frequencies(head_dim: int, theta: float) -> torch.Tensor:
    """1 / theta^(2i / head_dim), float32."""
    exponent = torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim
    return 1.0 / (theta ** exponent)


def scaled_frequencies(inv_freq: torch.Tensor, scaling: dict[str, Any] | None,
                       head_dim: int, theta: float) -> torch.Tensor:
    """Rotary frequencies under a rope scaling, as Hugging Face's config.json names them:
    `linear` divides every frequency by `factor` (positions interpolated); `llama3` (Llama 3.1)
    divides only the low frequencies, those whose wavelength exceeds
    original_max_position_embeddings / low_freq_factor, keeps the high ones (wavelength below
    original / high_freq_factor) and blends linearly in between; `yarn` (Peng et al. 2023)
    ramps from interpolated to kept over the dimensions between those that turn beta_fast and
    beta_slow times in original_max_position_embeddings."""
    if scaling is None:
        return inv_freq
    factor = float(scaling["factor"])
    kind = scaling.get("rope_type", scaling.get("type"))  # older files say "type"
    if kind == "linear":
        return inv_freq / factor
    if kind == "yarn":
        return _yarn_frequencies(scaling, head_dim, theta)
    low, high = float(scaling["low_freq_factor"]), float(scaling["high_freq_factor"])
    original = float(scaling["original_max_position_embeddings"])
    wavelength = 2 * math.pi / inv_freq
    scaled = torch.where(wavelength > original / low, inv_freq / factor, inv_freq)
    smooth = (original / wavelength - low) / (high - low)
    blended = (1 - smooth) * scaled / factor + smooth * scaled
    medium = ~(wavelength < original / high) * ~(wavelength > original / low)
    return torch.where(medium, blended, scaled)


def _yarn_frequencies(scaling: dict[str, Any], head_dim: int, theta: float) -> torch.Tensor:
    original = float(scaling["original_max_position_embeddings"])
    factor = float(scaling["factor"])

    def dimension(rotations: float) -> float:  # the dimension that turns this often
        return head_dim * math.log(original / (rotations * 2 * math.pi)) / (2 * math.log(theta))

    low, high = dimension(float(scaling.get("beta_fast") or 32)), dimension(
        float(scaling.get("beta_slow") or 1))
    if scaling.get("truncate", True):
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, head_dim - 1)
    high = high + 0.001 if low == high else high
    ramp = ((torch.arange(head_dim // 2, dtype=torch.float32) - low) / (high - low)).clamp(0, 1)
    kept = 1 - ramp  # 1 for the high frequencies (extrapolated), 0 for the interpolated
    powers = theta ** (torch.arange(0, head_dim, 2).float() / head_dim)
    return 1.0 / (factor * powers) * (1 - kept) + 1.0 / powers * kept


def yarn_attention_factor(scaling: dict[str, Any] | None) -> float:
    """YaRN's scale of cos and sin (1 for every other scaling): attention_factor if given, else
    0.1 ln(factor) + 1, or with mscale and mscale_all_dim the ratio of two such terms."""
    if scaling is None or scaling.get("rope_type", scaling.get("type")) != "yarn":
        return 1.0
    if scaling.get("attention_factor") is not None:
        return float(scaling["attention_factor"])
    factor = float(scaling["factor"])

    def mscale(weight: float) -> float:
        return 1.0 if factor <= 1 else 0.1 * weight * math.log(factor) + 1.0

    if scaling.get("mscale") and scaling.get("mscale_all_dim"):
        return mscale(float(scaling["mscale"])) / mscale(float(scaling["mscale_all_dim"]))
    return mscale(1.0)


def apply_rotary(x: torch.Tensor, rotary: Rotary) -> torch.Tensor:
    """Rotate (B, nh, T, hd) by the half-split convention (GPT-NeoX, Llama)."""
    cos, sin = (table.to(x.dtype) for table in rotary)  # computed in float32
    first, second = x.chunk(2, dim=-1)
    return x * cos + torch.cat([-second, first], dim=-1) * sin
