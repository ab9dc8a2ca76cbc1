"""Image files of given modes, sizes and formats, random pixels from a seed: what the
preprocessing tests compare with transformers' processors on."""

from __future__ import annotations

from pathlib import Path

import numpy as np

BANDS = {"RGB": 3, "RGBA": 4, "LA": 2}  # any other mode: one band (L, and P made from L)


def write_images(folder: Path, files: list[tuple[str, int, int, str]], seed: int) -> list[Path]:
    """(mode, width, height, format) each as `folder/{index}-{mode}.{format}`; a P image has a
    palette with a transparent index (transformers composites it on white)."""
    from PIL import Image

    rng = np.random.default_rng(seed)
    paths = []
    for index, (mode, width, height, kind) in enumerate(files):
        bands = BANDS.get(mode, 1)
        array = rng.integers(0, 256, (height, width, bands), dtype=np.uint8)
        image = Image.fromarray(array[..., 0] if bands == 1 else array,
                                "L" if mode == "P" else mode)
        if mode == "P":
            image = image.convert("P")
            image.info["transparency"] = 0
        paths.append(folder / f"{index}-{mode}.{kind}")
        image.save(paths[-1])
    return paths
