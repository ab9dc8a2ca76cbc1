"""The input stem as a block kind (`stem`): what turns the graph's input into the first hidden
states. `token_embedding` (the default) is the text families' token, position and token-type
embeddings; `patch_embedding` is a ViT's (Dosovitskiy et al. 2020): the image cut into
patch_size x patch_size patches, each projected to d_model (a Conv2d whose stride is its
kernel: a linear map of each flattened patch), a learned class token before them and a learned
position per patch and for the class token. No torch: zoo/blocks/patches.py builds it.
`mel_frames` is Whisper's (Radford et al. 2022): log-mel frames (n_mels, frames) through two
Conv1d of kernel 3 (the second of stride 2) with GELU, plus fixed sinusoidal positions, one per
encoder state (max_source_positions); zoo/blocks/mel_frames.py builds it.

The patch stem's fields (image_size, patch_size, channels) and the mel stem's (n_mels,
max_source_positions) are present in a resolved card only where the card selects it; their
checks across fields are `check_patches` and `check_mel_frames`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from registry.blocks import LEARNED, BlockEntry, register_block
from registry.errors import CardError

TOKEN_EMBEDDING, PATCH_EMBEDDING = "token_embedding", "patch_embedding"
MEL_FRAMES = "mel_frames"
MAX_IMAGE_SIZE = 2**14  # pixels a side; the largest published ViTs read 518 or 896
MAX_SOURCE_POSITIONS = 2**16  # encoder states; Whisper's 1500 are 30 s of audio

FIELDS: dict[str, dict[str, Any]] = {
    "image_size": dict(type=int, help="height and width of the (square) input image, in "
                       "pixels", minimum=1, maximum=MAX_IMAGE_SIZE),
    "patch_size": dict(type=int, help="height and width of one patch, in pixels; divides "
                       "image_size", minimum=1, maximum=MAX_IMAGE_SIZE),
    "channels": dict(type=int, default=3, help="colour channels of the input (3: RGB)",
                     minimum=1, maximum=64),
    "class_token": dict(type=bool, default=True, help="a learned class token before the "
                        "patches, with a position of its own (SigLIP's vision tower has none)"),
    "patch_bias": dict(type=bool, default=True, help="a bias on the patch projection (CLIP's "
                       "has none)"),
    "stem_norm": dict(type=bool, default=False, help="a norm over the embedded patches before "
                      "the first layer (CLIP's pre_layrnorm)"),
}


MEL_FIELDS: dict[str, dict[str, Any]] = {
    "n_mels": dict(type=int, default=80, help="mel bins of each input frame (Whisper: 80, "
                   "large-v3: 128)", minimum=1, maximum=1024),
    "max_source_positions": dict(type=int, default=1500, help="encoder states (positions "
                                 "after the stride-2 convolution: 1500 for 30 s of audio)",
                                 minimum=1, maximum=MAX_SOURCE_POSITIONS),
}


def num_patches(card: Mapping[str, Any]) -> int:
    return (card["image_size"] // card["patch_size"]) ** 2


def token_stem_params(card: Mapping[str, Any]) -> int:
    """Token embeddings and token types (the positions are the position block's)."""
    return (card["vocab_size"] + card["type_vocab_size"]) * card["d_model"]


def patch_stem_params(card: Mapping[str, Any]) -> int:
    """The projection (weight and bias), the class token and a position per patch and for the
    class token where the card has one (the stem's norm is counted with the norms)."""
    d, patch = card["d_model"], card["patch_size"]
    projection = card["channels"] * patch * patch * d + (d if card["patch_bias"] else 0)
    tokens = 1 if card["class_token"] else 0
    return projection + tokens * d + (num_patches(card) + tokens) * d


def mel_stem_params(card: Mapping[str, Any]) -> int:
    """Two Conv1d of kernel 3 (weights and biases) and the sinusoids, which transformers keeps
    as a (frozen) weight, so they count as its parameters do."""
    d = card["d_model"]
    convolutions = (card["n_mels"] * d * 3 + d) + (d * d * 3 + d)
    return convolutions + card["max_source_positions"] * d


def is_mel_card(card: Any) -> bool:
    """Whether a card (resolved, or anything with its fields) reads log-mel frames."""
    try:
        return card["stem"] == MEL_FRAMES
    except KeyError:  # a card from before stems
        return False


def is_patch_card(card: Any) -> bool:
    """Whether a card (resolved, or anything with its fields) reads pixels."""
    try:
        return card["stem"] == PATCH_EMBEDDING
    except KeyError:  # a card from before stems
        return False


def register(field: Callable[..., Any]) -> None:
    """Add the stems to registry/blocks.py's table, the patch stem's fields made by `field`
    (registry.schema.Field, which registry/schema.py passes: it imports this module)."""
    register_block("stem", BlockEntry(TOKEN_EMBEDDING, "zoo.blocks.embeddings:Embeddings",
                                      token_stem_params))
    register_block("stem", BlockEntry(
        PATCH_EMBEDDING, "zoo.blocks.patches:PatchEmbedding", patch_stem_params,
        fields={name: field(**spec) for name, spec in FIELDS.items()}))
    register_block("stem", BlockEntry(
        MEL_FRAMES, "zoo.blocks.mel_frames:MelFrameStem", mel_stem_params,
        fields={name: field(**spec) for name, spec in MEL_FIELDS.items()}))


# What a patch card cannot have: the text stem's parts and the heads that read tokens.
TEXT_ONLY = ("type_vocab_size", "embedding_norm", "mlm_head", "scale_embeddings")


def _selects(card: dict[str, Any], stem: str, family: str, where: str) -> bool:
    """Whether the card selects `stem`; refused where its family is not the one `stem` is for."""
    if card["stem"] != stem:
        return False
    if card["family"] != family:
        raise CardError(f"{where}: stem={stem} applies only to family {family}, not "
                        f"{card['family']}")
    return True


def check_patches(card: dict[str, Any], where: str) -> None:
    """A patch stem's card: an encoder, the image a whole number of patches, the positions
    the stem's own (learned), none of the text stem's parts."""
    if not _selects(card, PATCH_EMBEDDING, "encoder", where):
        return
    if card["image_size"] % card["patch_size"]:
        raise CardError(f"{where}: image_size={card['image_size']} is not a multiple of "
                        f"patch_size={card['patch_size']} (the image is cut into whole patches)")
    if card["position"] != LEARNED:
        raise CardError(f"{where}: stem={PATCH_EMBEDDING} has learned positions of its own: "
                        f"position should be {LEARNED}, not {card['position']}")
    _refuse_text_parts(card, where, "a patch stem reads pixels")
    if not card["class_token"] and card["pooling"] in ("cls", "pooler"):
        raise CardError(f"{where}: pooling={card['pooling']} reads the class token, but "
                        "class_token is false")
    if card["attention_pattern"][:card["n_layers"]].count("L"):
        raise CardError(f"{where}: stem={PATCH_EMBEDDING} attends globally: attention_pattern "
                        "should be G")


def check_mel_frames(card: dict[str, Any], where: str) -> None:
    """A mel stem's card (Whisper): an encoder-decoder whose decoder reads tokens at learned
    positions, the sinusoids split in sine and cosine halves (an even d_model), none of the
    text stem's parts."""
    if not _selects(card, MEL_FRAMES, "encoder-decoder", where):
        return
    if card["d_model"] % 2 or card["d_model"] < 4:
        raise CardError(f"{where}: stem={MEL_FRAMES} needs an even d_model of 4 or more for "
                        f"its sine and cosine halves, not {card['d_model']}")
    if card["position"] != LEARNED:
        raise CardError(f"{where}: stem={MEL_FRAMES} has sinusoids of its own in the encoder; "
                        f"the decoder's positions should be {LEARNED}, not {card['position']}")
    _refuse_text_parts(card, where, "a mel stem reads audio frames")


def _refuse_text_parts(card: dict[str, Any], where: str, reads: str) -> None:
    for name in TEXT_ONLY:
        if card[name]:
            raise CardError(f"{where}: {name}={card[name]!r} applies only to stem "
                            f"{TOKEN_EMBEDDING} ({reads}, not tokens)")
