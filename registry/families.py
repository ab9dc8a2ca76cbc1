"""What a family is, as data: its stacks, whether it generates, the poolings a sentence vector
may use, its Hugging Face naming, its prompt's noun. Torch-free, so the runtime, the importers
and the Hugging Face files read these fields instead of switching on the family's name;
export/family.py's Family wraps a spec with what the exporter adds (graphs, checks); PerKind
holds what another command needs per family (bench, attention maps).

`spec_of(card)` is the one lookup: a decoder card with a pooling is the `sequence` variant (a
classifier or embedder, as GPT2ForSequenceClassification), which encodes and does not generate.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Generic, TypeVar

from registry.errors import ZooError

POOLINGS = ("cls", "mean", "last", "pooler")
# A dual encoder's text vector (registry/dual.py): the state at the first end token (CLIP's
# `eos`) or at the last position (SigLIP's `last`).
DUAL_POOLINGS = ("eos", "last")


def _frozen(mapping: dict[str, Any] | None = None) -> Mapping[str, Any]:
    return MappingProxyType(dict(mapping or {}))


@dataclass(frozen=True, eq=False)
class FamilySpec:
    name: str  # the card's `family`
    kind: str  # the spec's own name: the family's, or a variant's (`sequence`)
    stacks: tuple[str, ...]  # the layer stacks, in the order a forward runs them
    cross_attention: bool = False  # the decoder attends to an encoded source
    generates: bool = False  # decoders and encoder-decoders generate; encoders encode
    continues_prompt: bool = True  # generated text follows the prompt (not a translation)
    poolings: tuple[str, ...] = ()  # what a sentence vector may be made of (none: no pooling)
    default_pooling: str = "cls"  # what a classifier reads when its card names no pooling
    prompt_noun: str = "a prompt"  # what the ids it is given are called in errors
    # the endings of the transformers class names it is (config.json's `architectures`);
    # None: named by its heads (an encoder: Model, ForMaskedLM, ForSequenceClassification)
    hf_architectures: tuple[str, ...] | None = None
    no_hf_class: str | None = None  # why its cards have no config.json, if they have none
    hf_config_extras: Mapping[str, Any] = field(default_factory=_frozen)  # config.json adds
    generation_extras: Mapping[str, Any] = field(default_factory=_frozen)  # generation_config
    default_generate: int = 0  # tokens `zoo attention` generates when not told
    pooled_variant: FamilySpec | None = None  # the spec of its cards that set a pooling
    image_variant: FamilySpec | None = None  # the spec of its cards with a patch stem (ViT)
    audio_variant: FamilySpec | None = None  # the spec of its cards with a mel stem (Whisper)
    inputs_noun: str = "token ids"  # what its graph reads, in errors
    # the ending of the transformers class name of its classifiers
    hf_classifier: str = "ForSequenceClassification"
    joint_space: bool = False  # texts and images into one space (a dual encoder's towers)

    def generated_length(self, prompt_length: int, new_tokens: int) -> int:
        """Positions the generated sequence occupies (checked against max_positions): the
        encoder-decoder's target is the start token, then the new tokens."""
        return new_tokens + 1 if self.cross_attention else prompt_length + new_tokens


# An encoder whose stem reads pixels (registry/stems.py): a ViT, classifying on its class token.
IMAGE = FamilySpec("encoder", "image", ("encoder",), poolings=("cls", "pooler"),
                   prompt_noun="an image", inputs_noun="pixel values",
                   hf_classifier="ForImageClassification")
ENCODER = FamilySpec("encoder", "encoder", ("encoder",), poolings=POOLINGS, image_variant=IMAGE)
SEQUENCE = FamilySpec("decoder", "sequence", ("decoder",), poolings=("mean", "last"),
                      default_pooling="last", no_hf_class="a pooled decoder")
DECODER = FamilySpec("decoder", "decoder", ("decoder",), generates=True,
                     poolings=SEQUENCE.poolings, default_pooling="last",
                     hf_architectures=("ForCausalLM", "LMHeadModel"), pooled_variant=SEQUENCE)
# An encoder-decoder whose source is log-mel audio frames (registry/stems.py): Whisper.
SPEECH = FamilySpec(
    "encoder-decoder", "speech", ("encoder", "decoder"), cross_attention=True,
    generates=True, continues_prompt=False, prompt_noun="audio", inputs_noun="log-mel frames",
    hf_architectures=("",),
    hf_config_extras=_frozen({"is_encoder_decoder": True}),
    generation_extras=_frozen({"num_beams": 1}), default_generate=16)
# transformers.js reads `is_encoder_decoder` from config.json alone (it knows no MarianConfig
# defaults), and MarianConfig's default forced_eos_token_id (0) would force an end token at
# max_length where `zoo run` forces none.
ENCODER_DECODER = FamilySpec(
    "encoder-decoder", "encoder-decoder", ("encoder", "decoder"), cross_attention=True,
    generates=True, continues_prompt=False, prompt_noun="source", hf_architectures=("",),
    hf_config_extras=_frozen({"is_encoder_decoder": True, "forced_eos_token_id": None}),
    generation_extras=_frozen({"num_beams": 1, "forced_eos_token_id": None}),
    default_generate=16, audio_variant=SPEECH)

# A dual encoder (CLIP, SigLIP; registry/dual.py): a text tower and an image tower into one
# space, compared by a scaled cosine. It encodes; its classes are named by their towers.
DUAL_ENCODER = FamilySpec("dual-encoder", "dual-encoder", ("text", "vision"),
                          poolings=DUAL_POOLINGS, default_pooling="eos", prompt_noun="a text",
                          hf_architectures=("Model",), joint_space=True)

SPECS: dict[str, FamilySpec] = {spec.name: spec for spec in (ENCODER, DECODER, ENCODER_DECODER,
                                                             DUAL_ENCODER)}


def spec_of(card: Any) -> FamilySpec:
    """The spec for a card (or anything with the card's `family` and `pooling` fields)."""
    spec = SPECS[card["family"]]
    if spec.pooled_variant is not None and card["pooling"] is not None:
        return spec.pooled_variant
    if spec.image_variant is not None and _has_field(card, "image_size"):  # a patch stem's
        return spec.image_variant
    if spec.audio_variant is not None and _has_field(card, "n_mels"):  # a mel stem's
        return spec.audio_variant
    return spec


def _has_field(card: Any, name: str) -> bool:
    """Whether a resolved card has a block's own field (present only where it selects it)."""
    try:
        return card[name] is not None
    except KeyError:
        return False


def register_spec(spec: FamilySpec) -> None:
    """Add a family's spec (a plugin's, or a test's); one name twice is an error."""
    if spec.name in SPECS:
        raise ZooError(f"family '{spec.name}' is already registered")
    SPECS[spec.name] = spec


Value = TypeVar("Value")


class PerKind(Generic[Value]):
    """What a command needs for each family, registered against its spec's `kind` (so the
    exporter's Family holds export alone): `zoo bench`'s measurements, `zoo attention`'s maps.
    `what` names the command in its errors."""

    def __init__(self, what: str, entries: dict[str, Value]) -> None:
        self.what, self.entries = what, entries

    def of(self, spec: FamilySpec) -> Value:
        try:
            return self.entries[spec.kind]
        except KeyError:
            raise ZooError(f"{self.what}: nothing is registered for a {spec.kind}") from None

    def register(self, spec: FamilySpec, value: Value) -> None:
        """A plugin family's; one kind twice is an error."""
        if spec.kind in self.entries:
            raise ZooError(f"{self.what}: a {spec.kind} is already registered")
        self.entries[spec.kind] = value
