"""`zoo attention --image`: where a ViT's class token looks. Per head of one layer, the class
token's attention over the patches (its row of the map, the class token's own column left out)
as the patch grid stretched over the image the model sees (resized and cropped by its
processor); and attention rollout (Abnar & Zuidema 2020, "Quantifying Attention Flow in
Transformers") as one more panel: the class token's share of each patch through every layer.

The maps come from the engine's `attentions.N` outputs (PyTorch recording, or an export made
with `--attentions`), one image run once.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from export.family import attention_names
from registry.catalog import Card
from registry.paths import display_path
from runtime.contract import MODEL_GRAPH
from runtime.engine import Engine
from runtime.files.images import model_processor, normalized, open_rgb, resized
from zoo.plots.draw import Panel

GROUP = "attentions"  # an encoder's one group of maps


@dataclass
class ImageLooked:
    card: Card
    engine: str
    image: Path
    picture: np.ndarray  # (H, W, 3) uint8: the image as the model sees it
    maps: np.ndarray  # (layers, heads, 1 + patches, 1 + patches), the class token first
    layer: int
    heads: list[int]

    def on_patches(self, row: np.ndarray) -> np.ndarray:
        """A class token's row over (1 + patches) keys as the (side, side) patch grid."""
        side = self.card["image_size"] // self.card["patch_size"]
        return row[1:].reshape(side, side)

    def class_token(self, head: int) -> np.ndarray:
        return self.on_patches(self.maps[self.layer, head, 0])

    def rollout(self) -> np.ndarray:
        return self.on_patches(rollout(self.maps)[0])


def rollout(maps: np.ndarray) -> np.ndarray:
    """Attention rollout of one input's maps (layers, heads, tokens, tokens): each layer's heads
    averaged, the identity added (the residual connection carries each token through),
    rows renormalized, and the layers multiplied from the first up. Row i of the (tokens,
    tokens) result is how much token i after the last layer draws on each input token."""
    identity = np.eye(maps.shape[-1])
    flow = identity
    for layer in maps:
        mixed = layer.mean(axis=0) + identity
        mixed /= mixed.sum(axis=-1, keepdims=True)
        flow = mixed @ flow
    return flow


def look_image(engine: Engine, card: Card, folder: Path | None, engine_name: str,
               image: Path, layer: int, heads: list[int]) -> ImageLooked:
    """Run the engine once over the image (as the model's processor prepares it)."""
    processor = model_processor(folder, card)
    picture = resized(open_rgb(image), processor, display_path(image))
    pixels = normalized(picture, processor)[None]
    outputs = engine.run(MODEL_GRAPH, {"pixel_values": pixels})
    maps = np.stack([outputs[name][0] for name in attention_names((GROUP,), card["n_layers"])])
    return ImageLooked(card, engine_name, image, picture, maps.astype(np.float64), layer, heads)


def image_panels(looked: ImageLooked) -> list[Panel]:
    """A panel per head of the layer, then the rollout, each over the picture."""
    over = looked.picture
    last = looked.card["n_layers"] - 1
    return [*(Panel(looked.class_token(head), f"layer {looked.layer} head {head}",
                    background=over) for head in looked.heads),
            Panel(looked.rollout(), f"rollout, layers 0-{last}", background=over)]


def image_json(looked: ImageLooked) -> dict[str, Any]:
    flow = looked.rollout()
    return {"model": looked.card.name, "family": looked.card.family, "engine": looked.engine,
            "attention": "class token over patches", "image": display_path(looked.image),
            "grid": list(flow.shape),
            "panels": [{"layer": looked.layer, "head": head,
                        "weights": looked.class_token(head).tolist()} for head in looked.heads],
            "rollout": flow.tolist()}
