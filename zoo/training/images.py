"""`--task classify` on an image model (a card with a patch stem, a ViT): without --data, the
8x8 handwritten digits scikit-learn ships (1,797 images, 10 classes; no download), each drawn
as a greyscale image and run through the same preprocessing as `zoo run --image`
(runtime/files/images.py at ViTImageProcessor's settings for the card's size), so a trained
folder's export classifies image files as it was trained. A share is held out
(`--eval-fraction`, 0.2 unless told) and scored at each checkpoint, as the text classifier's
rows. With --data DIR, a folder per label: zoo/training/image_folders.py.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import nn

from registry.catalog import Card
from registry.errors import ZooError
from registry.schema import validate
from runtime.files.images import (
    PREPROCESSOR_CONFIG,
    Processor,
    default_config,
    pixel_values,
    processor_from,
)
from zoo.assemble import build_model
from zoo.training.classify import EVAL_BATCH, carry_weights

DIGITS = [str(digit) for digit in range(10)]
DEFAULT_EVAL_FRACTION = 0.2
DIGIT_MAX = 16  # load_digits' pixels are 0..16


def digit_images() -> tuple[np.ndarray, np.ndarray]:
    """(images (N, 8, 8) uint8 0..255, labels (N,)): scikit-learn's digits, white on black."""
    try:
        from sklearn.datasets import load_digits
    except ImportError:
        raise ZooError("--task classify on an image model trains on scikit-learn's digits: "
                       "pip install '.[export]'") from None
    digits = load_digits()
    images = np.rint(digits.images * (255 / DIGIT_MAX)).astype(np.uint8)
    return images, digits.target.astype(np.int64)


def card_processor(card: Card) -> Processor:
    """ViTImageProcessor's settings at the card's size: what training feeds and writes."""
    return processor_from(default_config(card["image_size"]), PREPROCESSOR_CONFIG)


def pixels_of(images: np.ndarray, card: Card) -> torch.Tensor:
    """(N, channels, image_size, image_size): each image as `zoo run --image` would see it."""
    from PIL import Image

    processor = card_processor(card)
    return torch.from_numpy(np.stack([
        pixel_values(Image.fromarray(image, "L").convert("RGB"), processor, "digits")
        for image in images]))


def image_classifier_card(card: Card, labels: list[str] = DIGITS) -> Card:
    """`card` as a classifier of `labels` (its class token's vector)."""
    changes = {"num_labels": len(labels), "labels": labels, "pooling": card["pooling"] or "cls"}
    fields = validate({**card.fields, **changes}, f"{card.name} (--task classify)")
    return Card(card.name, card.path, fields, {**card.origins,
                                               **{key: "--task classify" for key in changes}})


def prepare_image_classifier(model: nn.Module, card: Card, seed: int, source: str,
                             labels: list[str] = DIGITS, data: str = "digits"
                             ) -> tuple[nn.Module, Card, dict[str, Any]]:
    """(the classifier, its card, the init record): every tensor of `model` it shares kept."""
    new_card = image_classifier_card(card, labels)
    classifier = build_model(new_card, seed=seed)
    return classifier, new_card, {"source": source, "from_card": card.name, "data": data,
                                  **carry_weights(model, classifier)}


@dataclass
class ImageSplit:
    pixels: torch.Tensor  # (N, C, H, W)
    labels: torch.Tensor  # (N,)


def split_digits(card: Card, fraction: float | None, seed: int
                 ) -> tuple[ImageSplit, ImageSplit]:
    """(train, held out): a seeded permutation, `fraction` of it held out."""
    fraction = DEFAULT_EVAL_FRACTION if fraction is None else fraction
    if not 0 < fraction < 1:
        raise ZooError(f"--eval-fraction {fraction}: should be between 0 and 1")
    images, labels = digit_images()
    order = np.random.default_rng(seed).permutation(len(images))
    held = int(round(len(images) * fraction))
    pixels = pixels_of(images[order], card)
    labels = torch.from_numpy(labels[order])
    return (ImageSplit(pixels[held:], labels[held:]), ImageSplit(pixels[:held], labels[:held]))


@torch.no_grad()
def predict(model: nn.Module, pixels: torch.Tensor) -> list[int]:
    was_training = model.training
    model.eval()
    found: list[int] = []
    for start in range(0, len(pixels), EVAL_BATCH):
        found += model(pixels[start:start + EVAL_BATCH])["logits"].argmax(dim=-1).tolist()
    model.train(was_training)
    return found


def check_options(card: Card, options: Any) -> None:
    """Refuse what an image model's run cannot read (before the classifier is made)."""
    if (options.data is not None and not options.data.is_dir()) or options.eval is not None:
        raise ZooError(f"{card.name}: an image model trains on a folder with a subfolder of "
                       "images per label (--data DIR, held out by --eval-fraction) or on "
                       "scikit-learn's digits; --data FILE and --eval (labelled text) are for "
                       "text models")
