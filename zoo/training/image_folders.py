"""`--task classify --data DIR` on an image model: DIR holds one subfolder per label (the
folder's name is the label, as torchvision's ImageFolder reads it), each with its image files.
Every file is decoded and preprocessed as `zoo run --image` does (runtime/files/images.py),
so the trained folder's export classifies files as it was trained. A share of each label is
held out (`--eval-fraction`, 0.2 unless told; stratified, so every label is trained on and
scored) and scored at each checkpoint.

Refused in one line, before any training: DIR missing or with no subfolders, a single label, a
label with no images (or too few to hold one out and train on the rest), a file that is not
a readable image (named), a path leaving DIR through a symlink, more than MAX_IMAGES images.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from registry.catalog import Card
from registry.errors import ZooError
from registry.paths import display_path, inside
from runtime.files.images import load_pixels
from zoo.training.images import DEFAULT_EVAL_FRACTION, ImageSplit, card_processor

MAX_IMAGES = 100_000  # about 1.2 GB of float32 pixels at 32 x 32; more: train from a loader


@dataclass(frozen=True)
class ImageFolder:
    labels: list[str]  # sorted subfolder names
    files: list[list[Path]]  # per label, its image files, sorted


def _visible(path: Path) -> bool:
    return not path.name.startswith(".")  # .DS_Store, .ipynb_checkpoints


def read_folder(root: Path) -> ImageFolder:
    """The labels and their files (not yet decoded), checked."""
    where = display_path(root)
    if not root.is_dir():
        raise ZooError(f"{where}: --data for an image model is a folder with one subfolder "
                       "per label")
    labels = sorted(entry.name for entry in root.iterdir() if entry.is_dir() and _visible(entry))
    if not labels:
        raise ZooError(f"{where}: no subfolders; expected one per label, holding its images")
    if len(labels) < 2:
        raise ZooError(f"{where}: one label ({labels[0]}); a classifier needs two or more")
    files = []
    for label in labels:
        folder = inside(root, label, where, "label folder")
        found = sorted(inside(folder, entry.name, where, "image")
                       for entry in folder.iterdir() if _visible(entry))
        if not found:
            raise ZooError(f"{display_path(folder)}: label '{label}' has no images")
        files.append(found)
    total = sum(len(found) for found in files)
    if total > MAX_IMAGES:
        raise ZooError(f"{where}: {total:,} images; at most {MAX_IMAGES:,} are read into memory")
    return ImageFolder(labels, files)


def split_folder(card: Card, root: Path, fraction: float | None, seed: int
                 ) -> tuple[ImageSplit, ImageSplit]:
    """(train, held out): per label, a seeded permutation of its images, `fraction` of them
    (rounded, at least one) held out and the rest trained on."""
    fraction = DEFAULT_EVAL_FRACTION if fraction is None else fraction
    if not 0 < fraction < 1:
        raise ZooError(f"--eval-fraction {fraction}: should be between 0 and 1")
    folder = read_folder(root)
    rng = np.random.default_rng(seed)
    train: list[tuple[Path, int]] = []
    held: list[tuple[Path, int]] = []
    for index, files in enumerate(folder.files):
        count = max(1, round(len(files) * fraction))
        if count >= len(files):
            raise ZooError(f"{display_path(files[0].parent)}: {len(files)} image(s); label "
                           f"'{folder.labels[index]}' needs more to hold {count} out and train "
                           "on the rest")
        order = rng.permutation(len(files))
        held += [(files[i], index) for i in order[:count]]
        train += [(files[i], index) for i in order[count:]]
    return _decoded(train, card), _decoded(held, card)


def _decoded(rows: list[tuple[Path, int]], card: Card) -> ImageSplit:
    processor = card_processor(card)
    pixels = load_pixels([path for path, _ in rows], processor)
    return ImageSplit(torch.from_numpy(pixels),
                      torch.tensor([label for _, label in rows], dtype=torch.long))
