"""CLIP's and SigLIP's preprocessing without torch (runtime/files/images.py): pixel values
equal to transformers' CLIPImageProcessor (the shortest edge resized bicubic, a center crop,
OpenAI's mean and std) and SiglipImageProcessor (a fixed-size resize, no crop) within 1e-6, on
PNG and JPEG files of several sizes and modes the test makes. test_images.py holds ViT's."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from runtime.files.images import load_pixels, processor_from
from tests.support.image_files import write_images

transformers = pytest.importorskip("transformers")
Image = pytest.importorskip("PIL.Image")

# mode, width, height, format: wide and tall (the crop takes the middle of the long side),
# alpha and palette (composited on white), grey, and a JPEG of each shape
FILES = [("RGB", 45, 30, "png"), ("L", 17, 50, "png"), ("RGBA", 64, 64, "png"),
         ("P", 33, 21, "png"), ("RGB", 300, 200, "jpeg"), ("L", 50, 61, "jpeg")]


def processors() -> dict[str, tuple[type, dict]]:
    """transformers' classes with their published settings, at a 32-pixel side."""
    clip = transformers.CLIPImageProcessorPil(size={"shortest_edge": 32},
                                              crop_size={"height": 32, "width": 32})
    siglip = transformers.SiglipImageProcessorPil(size={"height": 32, "width": 32}, resample=2)
    return {"CLIPImageProcessor": clip, "SiglipImageProcessor": siglip}


@pytest.fixture(scope="module")
def images(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    return write_images(tmp_path_factory.mktemp("images"), FILES, seed=3)


@pytest.mark.parametrize("name", ["CLIPImageProcessor", "SiglipImageProcessor"])
def test_pixel_values_are_transformers(images: list[Path], name: str, tmp_path: Path) -> None:
    reference = processors()[name]
    reference.save_pretrained(tmp_path)  # the file an import copies, as transformers writes it
    config = json.loads((tmp_path / "preprocessor_config.json").read_text())
    assert config["image_processor_type"] == name
    ours = load_pixels(images, processor_from(config, "test"))
    for row, path in enumerate(images):
        with Image.open(path) as image:
            expected = reference(image, return_tensors="np")["pixel_values"][0]
        assert ours[row].shape == expected.shape == (3, 32, 32)
        np.testing.assert_allclose(ours[row], expected, atol=1e-6, rtol=0, err_msg=path.name)


def test_openai_files_whole_number_size_is_the_shortest_edge(images: list[Path],
                                                             tmp_path: Path) -> None:
    """openai/clip-vit-base-patch32's preprocessor_config.json (a CLIPFeatureExtractor with
    `size: 224`, `crop_size: 224`), at 32: transformers reads the size as the shortest edge,
    not a square, and so does the zoo."""
    config = {"feature_extractor_type": "CLIPFeatureExtractor", "size": 32, "crop_size": 32,
              "do_resize": True, "do_center_crop": True, "do_normalize": True, "resample": 3,
              "image_mean": [0.48145466, 0.4578275, 0.40821073],
              "image_std": [0.26862954, 0.26130258, 0.27577711]}
    (tmp_path / "preprocessor_config.json").write_text(json.dumps(config))
    reference = transformers.AutoImageProcessor.from_pretrained(tmp_path)
    ours = load_pixels(images, processor_from(config, "test"))
    for row, path in enumerate(images):
        with Image.open(path) as image:
            expected = reference(image, return_tensors="np")["pixel_values"][0]
        np.testing.assert_allclose(ours[row], expected, atol=1e-6, rtol=0, err_msg=path.name)
