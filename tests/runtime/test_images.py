"""An image model's preprocessing without torch (runtime/files/images.py): pixel values equal
to transformers' ViTImageProcessor on PNG and JPEG files of several sizes and modes the test
makes, for the default settings and for a shortest-edge resize with a center crop; images that
must be refused (truncated, a decompression bomb's header) in one line naming the file, before
anything is decoded or written."""

from __future__ import annotations

import struct
import time
import zlib
from pathlib import Path

import numpy as np
import pytest

from runtime.files.images import (
    MAX_PIXELS,
    PREPROCESSOR_CONFIG,
    default_config,
    load_pixels,
    processor_from,
    resized_processor,
)
from tests.support.helpers import assert_one_line_error, zoo, zoo_ok

transformers = pytest.importorskip("transformers")
Image = pytest.importorskip("PIL.Image")

# mode, width, height, format: every mode convert_to_rgb treats apart (alpha, palette, grey)
FILES = [("RGB", 40, 30, "png"), ("L", 17, 50, "png"), ("RGBA", 64, 64, "png"),
         ("P", 33, 21, "png"), ("LA", 25, 25, "png"), ("RGB", 300, 200, "jpeg"),
         ("L", 50, 60, "jpeg")]
CONFIGS = {
    "default": default_config(32),
    "shortest edge, crop, bicubic": {
        **default_config(32), "size": {"shortest_edge": 40}, "do_center_crop": True,
        "crop_size": {"height": 32, "width": 32}, "resample": 3,
        "image_mean": [0.485, 0.456, 0.406], "image_std": [0.229, 0.224, 0.225]},
}


@pytest.fixture(scope="module")
def images(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    folder = tmp_path_factory.mktemp("images")
    rng = np.random.default_rng(0)
    paths = []
    for index, (mode, width, height, kind) in enumerate(FILES):
        bands = {"RGB": 3, "RGBA": 4, "LA": 2}.get(mode, 1)
        array = rng.integers(0, 256, (height, width, bands), dtype=np.uint8)
        image = Image.fromarray(array[..., 0] if bands == 1 else array,
                                "L" if mode == "P" else mode)
        if mode == "P":  # a palette with a transparent index
            image = image.convert("P")
            image.info["transparency"] = 0
        paths.append(folder / f"{index}-{mode}.{kind}")
        image.save(paths[-1])
    return paths


@pytest.mark.parametrize("name", CONFIGS)
def test_pixel_values_are_transformers(images: list[Path], name: str) -> None:
    config = CONFIGS[name]
    reference = transformers.ViTImageProcessorPil(
        **{key: value for key, value in config.items() if key != "image_processor_type"})
    ours = load_pixels(images, processor_from(config, "test"))
    for row, path in enumerate(images):
        with Image.open(path) as image:
            expected = reference(image, return_tensors="np")["pixel_values"][0]
        assert ours[row].shape == expected.shape == (3, 32, 32)
        np.testing.assert_allclose(ours[row], expected, atol=1e-6, rtol=0, err_msg=path.name)


def png(width: int, height: int, data: bytes) -> bytes:
    """A PNG file (8-bit RGB) of one IHDR, one IDAT holding `data`, IEND."""
    def chunk(kind: bytes, body: bytes) -> bytes:
        return (struct.pack(">I", len(body)) + kind + body
                + struct.pack(">I", zlib.crc32(kind + body)))

    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", data)
            + chunk(b"IEND", b""))


@pytest.fixture(scope="module")
def export(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("export") / "vit"
    zoo_ok("export", "vit-tiny", "--onnx", "--out", out)
    return out


def test_a_decompression_bomb_is_refused_before_decoding(export: Path, tmp_path: Path) -> None:
    """100,000 x 100,000 RGB would decode to 30 GB; its header alone is refused."""
    bomb = tmp_path / "bomb.png"
    bomb.write_bytes(png(100_000, 100_000, zlib.compress(b"\0" * 1_000_000)))
    assert 100_000 * 100_000 > MAX_PIXELS
    start = time.perf_counter()
    line = assert_one_line_error(zoo("run", export, "--image", bomb, "--json"))
    assert str(bomb) in line and "refused before decoding" in line
    assert time.perf_counter() - start < 30  # not a guard on speed: decoding would not end
    assert Image.MAX_IMAGE_PIXELS == MAX_PIXELS  # Pillow's own limit, set explicitly


def test_a_truncated_png_is_refused(export: Path, images: list[Path], tmp_path: Path) -> None:
    truncated = tmp_path / "truncated.png"
    truncated.write_bytes(images[2].read_bytes()[:400])  # the 64 x 64 RGBA one, cut
    line = assert_one_line_error(zoo("run", export, "--image", truncated))
    assert str(truncated) in line and "truncated" in line
    assert sorted(p.name for p in tmp_path.iterdir()) == ["truncated.png"]  # nothing written


def test_not_an_image_is_refused(export: Path, tmp_path: Path) -> None:
    text = tmp_path / "notes.png"
    text.write_text("not an image")
    assert_one_line_error(zoo("run", export, "--image", text), str(text), "not an image")


@pytest.mark.parametrize(("change", "expected"), [
    ({"resample": 9}, "resample=9"),
    ({"image_processor_type": "CLIPImageProcessor"}, "image_processor_type='CLIPImageProcessor'"),
    ({"size": {"height": 30, "width": 30}}, "the model reads 32 x 32"),
    ({"image_std": [0.5, 0.0, 0.5]}, "image_std"),
])
def test_a_processor_config_it_cannot_follow_is_refused(export: Path, images: list[Path],
                                                        tmp_path: Path, change: dict,
                                                        expected: str) -> None:
    """A copied export whose preprocessor_config.json says what the zoo does not compute (or
    what does not fit the model) is refused by name, the file named."""
    import json
    import shutil

    copy = tmp_path / "copy"
    shutil.copytree(export, copy)
    path = copy / "preprocessor_config.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), **change}))
    manifest = json.loads((copy / "manifest.json").read_text())
    from runtime.files.atomic import sha256

    manifest["files"]["preprocessor_config.json"]["sha256"] = sha256(path)
    (copy / "manifest.json").write_text(json.dumps(manifest))
    assert_one_line_error(zoo("run", copy, "--image", images[0]), "preprocessor_config.json",
                          expected)


def test_a_cropping_processor_resized_for_another_image_size(tmp_path: Path) -> None:
    """`zoo import --image-size`: a processor that resizes to 256 and crops 224, trained at
    224, becomes for 112 one that resizes to 128 and crops 112 (the same share cropped)."""
    (tmp_path / PREPROCESSOR_CONFIG).write_text(
        '{"size": {"shortest_edge": 256}, "do_center_crop": true, "crop_size": 224}')
    config = resized_processor(tmp_path, {"image_size": 112, "channels": 3}, 224)
    assert config is not None
    assert config["size"] == {"shortest_edge": 128}
    assert config["crop_size"] == {"height": 112, "width": 112}
