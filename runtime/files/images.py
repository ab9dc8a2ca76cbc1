"""Images to a ViT's `pixel_values` without torch (Pillow and numpy), as transformers'
ViTImageProcessor computes them from `preprocessor_config.json`: decode, convert to RGB
(transparency composited on white), resize with the processor's resample, center-crop where
the config says, rescale, normalize; (channels, height, width) float32.

Decoding is bounded: Pillow's limit is set here (MAX_PIXELS, 64 Mi pixels: 8192 x 8192), and an
image whose header says more is refused before any pixel is decoded (a 100,000 x 100,000 PNG is
a decompression bomb: 30 GB of RGB from a few kB of file). A truncated or corrupt file is
refused in one line naming it.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from registry.dual import image_tower
from registry.errors import ZooError
from registry.paths import display_path, inside
from runtime.files.json_files import read_json

PREPROCESSOR_CONFIG = "preprocessor_config.json"
MAX_PIXELS = 64 * 2**20  # width x height an image may declare (8192 x 8192)
# transformers' PILImageResampling values, as preprocessor_config.json writes `resample`
RESAMPLES = {0: "NEAREST", 1: "LANCZOS", 2: "BILINEAR", 3: "BICUBIC", 4: "BOX", 5: "HAMMING"}
IMAGENET_STANDARD = [0.5, 0.5, 0.5]  # ViTImageProcessor's mean and std
PROCESSORS = ("ViTImageProcessor", "ViTImageProcessorFast", "ViTFeatureExtractor")
# CLIP's (a shortest-edge bicubic resize and a center crop) and SigLIP's (a fixed-size resize)
# are the same steps, with other settings in the file
PROCESSORS += ("CLIPImageProcessor", "CLIPImageProcessorFast", "CLIPFeatureExtractor",
               "SiglipImageProcessor", "SiglipImageProcessorFast")
# CLIP's read a whole-number `size` as the shortest edge (transformers' default_to_square=False),
# where ViT's make it a square
SHORTEST_EDGE_INT = ("CLIPImageProcessor", "CLIPImageProcessorFast", "CLIPFeatureExtractor")


class ImageError(ZooError):
    """An image or a preprocessor_config.json that cannot be read."""


@dataclass(frozen=True)
class Processor:
    """What preprocessor_config.json says, checked. `size`: (height, width), or the shortest
    edge's length (the other edge scaled to keep the aspect ratio, as transformers rounds it)."""

    size: tuple[int, int] | int | None  # None: no resize
    resample: int
    crop: tuple[int, int] | None
    rescale: float | None
    mean: tuple[float, ...] | None  # None: no normalize
    std: tuple[float, ...] | None

    def output_size(self) -> tuple[int, int] | None:
        """The (height, width) every image comes out at, where the config fixes it."""
        if self.crop is not None:
            return self.crop
        return self.size if isinstance(self.size, tuple) else None


def default_config(image_size: int) -> dict[str, Any]:
    """ViTImageProcessor's settings at the card's image size: what an export of a card built
    here (no processor of its own) writes."""
    return {"image_processor_type": "ViTImageProcessor", "do_resize": True,
            "size": {"height": image_size, "width": image_size}, "resample": 2,
            "do_rescale": True, "rescale_factor": 1 / 255, "do_normalize": True,
            "image_mean": IMAGENET_STANDARD, "image_std": IMAGENET_STANDARD,
            "do_convert_rgb": True}


def _pair(value: Any, where: str, key: str, shortest: bool = False) -> tuple[int, int] | int:
    """A size object: {height, width}, or (for `size`) {shortest_edge}; an int is square."""
    if isinstance(value, int) and not isinstance(value, bool) and value > 0:
        return value, value
    if isinstance(value, dict):
        height, width = value.get("height"), value.get("width")
        if set(value) == {"height", "width"} and all(
                isinstance(n, int) and not isinstance(n, bool) and n > 0 for n in (height, width)):
            return height, width
        edge = value.get("shortest_edge")
        if shortest and set(value) == {"shortest_edge"} and isinstance(edge, int) and edge > 0:
            return edge
    wanted = "{height, width}" + (" or {shortest_edge}" if shortest else "")
    raise ImageError(f"{where}: {key}={value!r} should be {wanted} of whole numbers > 0")


def _numbers(config: dict[str, Any], key: str, where: str) -> tuple[float, ...]:
    value = config.get(key, IMAGENET_STANDARD)
    value = [value] * 3 if isinstance(value, int | float) and not isinstance(value, bool) else value
    if not (isinstance(value, list) and value and all(
            isinstance(x, int | float) and not isinstance(x, bool) for x in value)):
        raise ImageError(f"{where}: {key}={value!r} should be a number per channel")
    if key == "image_std" and not all(x > 0 for x in value):
        raise ImageError(f"{where}: image_std={value!r} should be numbers > 0")
    return tuple(float(x) for x in value)


def processor_from(config: Any, where: str) -> Processor:
    """A Processor from preprocessor_config.json's object; what it cannot compute is refused
    by name (another processor class, padding, an unknown resample)."""
    if not isinstance(config, dict):
        raise ImageError(f"{where}: should be a JSON object")
    kind = config.get("image_processor_type") or config.get("feature_extractor_type")
    if kind is not None and kind not in PROCESSORS:
        raise ImageError(f"{where}: image_processor_type={kind!r} is not supported (the zoo "
                         f"computes {', '.join(PROCESSORS)})")
    if config.get("do_pad"):
        raise ImageError(f"{where}: do_pad=true is not supported")
    resample = config.get("resample", 2)
    if resample not in RESAMPLES or isinstance(resample, bool):
        raise ImageError(f"{where}: resample={resample!r} should be one of "
                         + ", ".join(f"{k} ({v})" for k, v in RESAMPLES.items()))
    size_value = config.get("size", 224)
    if kind in SHORTEST_EDGE_INT and isinstance(size_value, int) and not isinstance(size_value,
                                                                                   bool):
        size_value = {"shortest_edge": size_value}  # openai's CLIP files: "size": 224
    size = (_pair(size_value, where, "size", shortest=True)
            if config.get("do_resize", True) else None)
    crop = (_pair(config.get("crop_size", 224), where, "crop_size")
            if config.get("do_center_crop", False) else None)
    rescale = config.get("rescale_factor", 1 / 255) if config.get("do_rescale", True) else None
    if rescale is not None and (isinstance(rescale, bool) or not isinstance(rescale, int | float)):
        raise ImageError(f"{where}: rescale_factor={rescale!r} should be a number")
    normalize = config.get("do_normalize", True)
    mean = _numbers(config, "image_mean", where) if normalize else None
    std = _numbers(config, "image_std", where) if normalize else None
    return Processor(size, resample, crop, None if rescale is None else float(rescale), mean,
                     std)


def read_processor(path: Path) -> Processor:
    return processor_from(read_json(path, ImageError), display_path(path))


def check_fits(processor: Processor, image_size: int, channels: int, where: str) -> None:
    """The processor's output is the card's input: image_size a side, a mean and std per
    channel (refused where not: the positions are learned for that many patches)."""
    size = processor.output_size()
    if size != (image_size, image_size):
        raise ImageError(f"{where}: the images come out at {size or 'their own size'} (size, "
                         f"crop_size), but the model reads {image_size} x {image_size}")
    for key, values in (("image_mean", processor.mean), ("image_std", processor.std)):
        if values is not None and len(values) != channels:
            raise ImageError(f"{where}: {key} has {len(values)} numbers; the model reads "
                             f"{channels} channels")


def open_rgb(path: Path) -> Any:
    """The image at `path` as a decoded RGB Pillow image, refused in one line naming the file
    where it is missing, not an image, truncated or larger than MAX_PIXELS."""
    return decoded_rgb(path, display_path(path))


def decoded_rgb(source: Any, where: str) -> Any:
    """An image file's path or an open binary file (`zoo serve`'s base64 images) decoded as
    open_rgb decodes it, refused in one line naming `where`."""
    from PIL import Image, UnidentifiedImageError

    Image.MAX_IMAGE_PIXELS = MAX_PIXELS  # Pillow refuses twice this itself; we refuse it here
    try:
        with Image.open(source) as image:  # reads the header only
            width, height = image.size
            if width * height > MAX_PIXELS:
                raise ImageError(f"{where}: {width} x {height} pixels is more than the "
                                 f"{MAX_PIXELS:,} an image may have (refused before decoding)")
            image.load()
            return to_rgb(image)
    except Image.DecompressionBombError:
        raise ImageError(f"{where}: more pixels than the {MAX_PIXELS:,} an image may have "
                         "(refused before decoding)") from None
    except FileNotFoundError:
        raise ImageError(f"{where}: no such file") from None
    except UnidentifiedImageError:
        raise ImageError(f"{where}: not an image Pillow can read") from None
    except (OSError, SyntaxError, ValueError) as exc:  # truncated or corrupt data
        raise ImageError(f"{where}: cannot decode the image ({str(exc).splitlines()[0]})") from None


def to_rgb(image: Any) -> Any:
    """transformers' convert_to_rgb: transparency (an alpha band, or a palette's transparent
    index) composited on white, any other mode converted."""
    from PIL import Image

    if image.mode == "RGB":
        return image.copy()
    if "A" in image.getbands() or image.info.get("transparency") is not None:
        rgba = image.convert("RGBA")
        background = Image.new("RGBA", rgba.size, (255, 255, 255, 255))
        return Image.alpha_composite(background, rgba).convert("RGB")
    return image.convert("RGB")


def _resized_size(size: tuple[int, int] | int, height: int, width: int) -> tuple[int, int]:
    if isinstance(size, tuple):
        return size
    short, long = min(height, width), max(height, width)
    scaled = int(size * long / short)  # transformers' get_resize_output_image_size
    return (size, scaled) if height <= width else (scaled, size)


def pixel_values(image: Any, processor: Processor, where: str) -> np.ndarray:
    """One RGB Pillow image to (3, H, W) float32, step by step as ViTImageProcessor."""
    return normalized(resized(image, processor, where), processor)


def resized(image: Any, processor: Processor, where: str) -> np.ndarray:
    """One RGB Pillow image resized and center-cropped as the processor says: the (H, W, 3)
    uint8 picture the model sees (`zoo attention --image` draws on it)."""
    if processor.size is not None:
        height, width = _resized_size(processor.size, image.height, image.width)
        image = image.resize((width, height), resample=processor.resample)
    array = np.asarray(image)  # (H, W, 3) uint8
    if processor.crop is not None:
        crop_height, crop_width = processor.crop
        height, width = array.shape[:2]
        if crop_height > height or crop_width > width:
            raise ImageError(f"{where}: crop_size {crop_height} x {crop_width} is larger than "
                             f"the resized image ({height} x {width})")
        top, left = (height - crop_height) // 2, (width - crop_width) // 2
        array = array[top:top + crop_height, left:left + crop_width]
    return array


def normalized(array: np.ndarray, processor: Processor) -> np.ndarray:
    """(H, W, 3) uint8 to (3, H, W) float32: rescaled and normalized as the processor says."""
    values = array.astype(np.float64)
    if processor.rescale is not None:
        values = values * processor.rescale
    values = values.astype(np.float32)
    if processor.mean is not None and processor.std is not None:
        mean = np.array(processor.mean, dtype=np.float32)
        std = np.array(processor.std, dtype=np.float32)
        values = (values - mean) / std
    return np.ascontiguousarray(values.transpose(2, 0, 1))


IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".webp", ".bmp", ".gif", ".tif", ".tiff")


def image_files(folder: Path) -> list[Path]:
    """The image files directly in `folder` (by suffix), in name order; none is an error, as
    is a symlink out of the folder (a hostile folder must not make a command read beside it)."""
    where = display_path(folder)
    if not Path(folder).is_dir():
        raise ImageError(f"{where}: no such folder")
    names = sorted(path.name for path in Path(folder).iterdir()
                   if path.suffix.lower() in IMAGE_SUFFIXES)
    if not names:
        raise ImageError(f"{where}: no image files ({', '.join(IMAGE_SUFFIXES)})")
    return [inside(folder, name, where, "image") for name in names]


def load_pixels(paths: list[Path], processor: Processor) -> np.ndarray:
    """(batch, 3, H, W) float32 for image files, each refused by name where unreadable."""
    return np.stack([pixel_values(open_rgb(Path(path)), processor, display_path(path))
                     for path in paths])


def processor_file(folder: Path, card: Any) -> Path | None:
    """A model folder's preprocessor_config.json, kept inside the folder, read and checked
    against the card's image (size and channels); None where the folder has none or the card
    reads no pixels."""
    tower = image_tower(card)
    if tower is None:
        return None
    path = inside(Path(folder), PREPROCESSOR_CONFIG, display_path(folder), "preprocessor config")
    if not path.is_file():
        return None
    check_fits(read_processor(path), tower["image_size"], tower["channels"], display_path(path))
    return path


def export_processor(folder: Path, card: Any) -> Processor:
    """The processor an export runs its images through (its preprocessor_config.json)."""
    path = processor_file(folder, card)
    if path is None:
        raise ImageError(f"{display_path(folder)}: no {PREPROCESSOR_CONFIG} (an image "
                         "model's export has one)")
    return read_processor(path)


def model_processor(folder: Path | None, card: Any) -> Processor:
    """The processor a model's images go through: its folder's preprocessor_config.json where
    it has one, else ViTImageProcessor's defaults at the card's size (what its export writes)."""
    path = processor_file(folder, card) if folder is not None else None
    if path is None:
        return processor_from(default_config(card["image_size"]), PREPROCESSOR_CONFIG)
    return read_processor(path)


def resized_processor(folder: Path, card: Any, trained_size: int) -> dict[str, Any] | None:
    """A folder's preprocessor_config.json (checked against the size its positions were
    trained at) rewritten for the card's image_size: the crop set to it where the processor
    crops (the resize before it scaled alike), else the resize. None where it has none."""
    path = inside(Path(folder), PREPROCESSOR_CONFIG, display_path(folder), "preprocessor config")
    if not path.is_file():
        return None
    where, side = display_path(path), card["image_size"]
    raw = read_json(path, ImageError)  # read once: checked, then rewritten
    check_fits(processor_from(raw, where), trained_size, card["channels"], where)
    config = dict(raw)
    if config.get("do_center_crop", False):
        scale = side / trained_size
        size = _pair(config.get("size", 224), where, "size", shortest=True)
        config["size"] = ({"shortest_edge": round(size * scale)} if isinstance(size, int) else
                          {"height": round(size[0] * scale), "width": round(size[1] * scale)})
        config["crop_size"] = {"height": side, "width": side}
    else:
        config["size"] = {"height": side, "width": side}
    check_fits(processor_from(config, where), side, card["channels"], where)
    return config
