"""Import public checkpoints in the Hugging Face layout (GPT-2, BERT and its sequence
classifier, MarianMT, Llama, Mistral, Qwen2, Qwen3, sentence-transformers folders) as built zoo
folders.

A source folder holds `config.json` and `model.safetensors` (and maybe `tokenizer.json`, or
MarianMT's sentencepiece files). The map
for its `model_type` (`registry/maps/*.yaml`) says which card it extends, how config.json keys
become card fields, and how tensor names become zoo names: each variant is data, and this file
only applies maps. Only safetensors are read; no pickle is ever loaded.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from registry.catalog import Card, open_catalog
from registry.errors import ZooError
from registry.layouts import MISSING, LayoutMap, Rule, known_maps, lookup
from registry.paths import display_path, inside
from registry.schema import ROPE_OPTIONAL, ROPE_SCALINGS, validate
from registry.stems import is_mel_card, num_patches
from runtime.files.atomic import atomic_folder, refuse_existing, sha256
from runtime.files.images import PREPROCESSOR_CONFIG, processor_file, resized_processor
from runtime.files.json_files import read_json
from runtime.files.tokenizer import HF_TOKENIZER, HuggingFaceTokenizer, check_tokenizer_file
from runtime.speech_tokens import GENERATION_CONFIG, read_speech_tokens, speech_files
from zoo.assemble import build_model
from zoo.blocks.patches import interpolated_positions
from zoo.files.json_types import CONFIG, check_types, config_kinds
from zoo.files.plausible import check_sizes
from zoo.files.sentence_transformers import MODULES, read_modules
from zoo.files.weights import read_tensors, save_built

SOURCE_CONFIG = "config.json"
SOURCE_WEIGHTS = "model.safetensors"
PICKLES = ("pytorch_model.bin", "pytorch_model.bin.index.json", "tf_model.h5",
           "flax_model.msgpack", "model.ckpt.index")
RECORD = "source.json"
SHOWN = 12  # names listed in one error line before "(+N more)"


Extra = Callable[[torch.nn.Module, Card, Path], None]  # the model, its card, the staged OUT


class CheckpointError(ZooError):
    """A checkpoint folder that cannot be imported: layout, config, or tensors do not match."""


def _listing(names: list[str]) -> str:
    more = f" (+{len(names) - SHOWN} more)" if len(names) > SHOWN else ""
    return ", ".join(names[:SHOWN]) + more


# --- transforms named in the maps: each takes one tensor and returns one per target

TRANSFORMS = {
    "none": lambda tensor: [tensor],
    "transpose": lambda tensor: [tensor.t().contiguous()],  # Conv1D (in, out) -> Linear (out, in)
    "split_qkv": lambda tensor: [part.contiguous() for part in tensor.chunk(3, dim=0)],
    "row": lambda tensor: [tensor.reshape(-1)],  # a (1, n) buffer -> (n,)
    "split_halves": lambda tensor: [part.contiguous() for part in tensor.chunk(2, dim=0)],
    "batch": lambda tensor: [tensor.unsqueeze(0)],  # CLIP's class token (d,) -> (1, 1, d)
}


def apply_rule(rule: Rule, tensor: torch.Tensor) -> list[torch.Tensor]:
    tensors = [tensor]
    for name in rule.transforms:
        tensors = [out for one in tensors for out in TRANSFORMS[name](one)]
    return tensors


# --- reading the source folder -------------------------------------------------------------

def source_file(folder: Path, name: str) -> Path:
    """A file of the source folder, refused where it is a symlink out of it."""
    return inside(folder, name, display_path(folder), "file")


def read_json_object(folder: Path, name: str, kind: str,
                     error: type[ZooError] = CheckpointError) -> tuple[dict[str, Any], str]:
    """A JSON object file of a source folder and its path as shown; refused in one line where
    it is missing, a symlink out of the folder, or not an object."""
    path = source_file(folder, name)
    where = display_path(path)
    if not path.is_file():
        raise error(f"{where}: no such file (a {kind} folder has one)")
    config = read_json(path)
    if not isinstance(config, dict):
        raise error(f"{where}: should be a JSON object, got {type(config).__name__}")
    return config, where


def read_config(folder: Path) -> dict[str, Any]:
    return read_json_object(folder, SOURCE_CONFIG, "Hugging Face model")[0]


def find_map(config: dict[str, Any], where: str) -> LayoutMap:
    check_types(config, CONFIG, where)
    maps = known_maps()
    architectures = config.get("architectures") or []
    model_type = config.get("model_type")
    if model_type is None:  # very old files name only the class
        model_type = next((key for key, layout in maps.items()
                           if set(architectures) & set(layout.architectures())), None)
    known = "; ".join(f"{key} ({', '.join(layout.architectures())})"
                      for key, layout in sorted(maps.items()))
    layout = maps.get(model_type) if isinstance(model_type, str) else None
    if layout is None or (architectures and not set(architectures) & set(layout.architectures())):
        found = f"model_type={model_type!r}, architectures={architectures}"
        raise CheckpointError(f"{where}: {found} is not a known layout; known: {known}")
    return layout


def find_weights(folder: Path) -> Path:
    path = source_file(folder, SOURCE_WEIGHTS)
    if path.is_file():
        return path
    where = display_path(folder)
    if (folder / f"{SOURCE_WEIGHTS}.index.json").is_file():
        raise CheckpointError(f"{where}: sharded safetensors (model.safetensors.index.json) are "
                              "not supported; save the model as one model.safetensors")
    pickles = [name for name in PICKLES if (folder / name).exists()]
    if pickles:
        raise CheckpointError(f"{where}: only {', '.join(pickles)}: pickle checkpoints are not "
                              "loaded; convert to safetensors (model.safetensors)")
    raise CheckpointError(f"{where}: no {SOURCE_WEIGHTS}")


def normalised_tensors(layout: LayoutMap, tensors: dict[str, torch.Tensor], where: str
                       ) -> tuple[dict[str, torch.Tensor], dict[str, str], list[str]]:
    """Tensors under the map's names: ({name: tensor}, {name: name in the file}, prefixes)."""
    named: dict[str, torch.Tensor] = {}
    original: dict[str, str] = {}
    prefixes: set[str] = set()
    for file_name, tensor in tensors.items():
        name, prefix = layout.normalise(file_name)
        if name in named:
            raise CheckpointError(f"{where}: {original[name]} and {file_name} are one tensor")
        named[name], original[name] = tensor, file_name
        if prefix:
            prefixes.add(prefix)
    return named, original, sorted(prefixes)


# --- config.json -> card -------------------------------------------------------------------

def _activation(layout: LayoutMap, key: str, value: Any, where: str) -> str:
    known = layout["activations"]
    if value not in known:
        raise CheckpointError(f"{where}: {key}={value!r} is not supported (known: "
                              f"{', '.join(known)})")
    return known[value]


def _rope_scaling(key: str, value: Any, where: str) -> Any:
    """config.json's rope scaling as the card's: transformers 5's `rope_parameters` also hold
    the base (rope_theta, a field of its own) and call no scaling `default`. A kind the rotary
    block computes is refused where it carries a setting that kind does not read; any other
    kind is left for the card's validation to refuse by name."""
    if not isinstance(value, dict):
        return value
    scaling = {name: item for name, item in value.items() if name != "rope_theta"}
    kind = scaling.get("rope_type", scaling.get("type"))
    if kind == "default" or not scaling:
        return None
    if kind not in ROPE_SCALINGS:
        return scaling  # the card's validation refuses it, naming the kind
    unread = sorted(set(scaling) - {"rope_type", "type", *ROPE_SCALINGS[kind],
                                    *ROPE_OPTIONAL.get(kind, ())})
    if unread:
        raise CheckpointError(f"{where}: {key} has {', '.join(unread)}, which the zoo's "
                              f"{kind} scaling does not read")
    return scaling


# transformers' layer_types -> the letters of the card's attention_pattern
LAYER_TYPES = {"sliding_attention": "L", "full_attention": "G"}
EVERY_N = "global_attn_every_n_layers"  # ModernBERT's pattern before layer_types: G, then L's


def shortest_period(letters: str) -> str:
    """The shortest pattern that, cycled, gives `letters` ("GLLGLLG" -> "GLL")."""
    return next(letters[:size] for size in range(1, len(letters) + 1)
                if all(letters[i] == letters[i % size] for i in range(len(letters))))


def _attention_pattern(key: str, value: Any, where: str) -> Any:
    """config.json's layer pattern as the card's letters: a list of layer types (transformers
    5), or a whole number: every n-th layer global, the first among them (ModernBERT's
    global_attn_every_n_layers) or the last (an older Gemma file's sliding_window_pattern).
    Another layer type is refused by name."""
    if isinstance(value, int) and not isinstance(value, bool) and value >= 1:
        return "G" + "L" * (value - 1) if key == EVERY_N else "L" * (value - 1) + "G"
    if isinstance(value, list):
        unknown = sorted({str(kind) for kind in value} - set(LAYER_TYPES))
        if unknown or not value or not all(isinstance(kind, str) for kind in value):
            raise CheckpointError(
                f"{where}: {key} has {', '.join(unknown) or 'no layers'}: {key}={value!r} "
                f"should list a kind per layer, each one of {', '.join(LAYER_TYPES)}")
        return shortest_period("".join(LAYER_TYPES[kind] for kind in value))
    return value  # the card's validation names it


def _local_base(key: str, value: Any, where: str) -> Any:
    """The local layers' rotary base: a number, or transformers 5's rope_parameters entry,
    which must be unscaled (the zoo scales only the global layers' frequencies)."""
    if not isinstance(value, dict):
        return value
    kind = value.get("rope_type", "default")
    if kind != "default" or "rope_theta" not in value:
        raise CheckpointError(f"{where}: {key} has rope_type={kind!r}: the zoo's local layers "
                              "rotate unscaled, with a rope_theta")
    return value["rope_theta"]


def _converted(layout: LayoutMap, field: str, key: str, value: Any, where: str) -> Any:
    """A config.json value in the card's terms, for the fields spelled otherwise there (a
    nested card's field, `vision.activation`, as the field itself)."""
    field = field.rpartition(".")[2]
    if field == "activation":
        return _activation(layout, key, value, where)
    if field == "rope_scaling":
        return _rope_scaling(key, value, where)
    if field == "attention_pattern":
        return _attention_pattern(key, value, where)
    if field == "rope_theta_local":
        return _local_base(key, value, where)
    return value


def _below(config: dict[str, Any], key: str, bound_key: str) -> bool:
    """Whether `key` is set (not null) and not at least `bound_key`'s number (Mistral's
    sliding_window shorter than max_position_embeddings: a window that really slides)."""
    value, bound = lookup(config, key), lookup(config, bound_key)
    if value is MISSING or value is None:
        return False
    numbers = all(isinstance(x, int | float) and not isinstance(x, bool) for x in (value, bound))
    return not numbers or value < bound


def _check_requires(layout: LayoutMap, config: dict[str, Any], where: str) -> None:
    """Refuse, in one line naming every key, the settings the zoo's blocks do not compute:
    `requires` (a key's one value), `equal` (two keys alike), `at_least` (a key, where set, not
    below another) and `each` (every entry of a list)."""
    wrong = [f"{key}={value!r} (needs {want!r})" for key, want in layout["requires"].items()
             if (value := lookup(config, key)) is not MISSING and value != want]
    wrong += [f"{key}={config[key]!r} (needs {other}={config[other]!r}: the zoo has one value "
              "for both stacks)" for key, other in layout["equal"].items()
              if key in config and other in config and config[key] != config[other]]
    wrong += [f"{key}={lookup(config, key)!r} (needs null or at least {other}="
              f"{lookup(config, other)!r})" for key, other in layout["at_least"].items()
              if _below(config, key, other)]
    wrong += [f"{key} has {', '.join(sorted({str(item) for item in value} - {want}))} (needs "
              f"every entry {want!r})" for key, want in layout["each"].items()
              if isinstance(value := lookup(config, key), list)
              and any(item != want for item in value)]
    if wrong:
        raise CheckpointError(f"{where}: unsupported settings: {', '.join(wrong)}")


def _token_id(spec: dict[str, Any], config: dict[str, Any],
              tokenizer: HuggingFaceTokenizer | None, vocab_size: int) -> int | None:
    """The first usable candidate: from config.json or the tokenizer, then the map's fallbacks.
    An id outside the vocabulary (a tiny model with GPT-2's defaults) is skipped."""
    keys = spec.get("config", [])
    found = next((lookup(config, key) for key in (keys if isinstance(keys, list) else [keys])
                  if lookup(config, key) not in (None, MISSING)), None)  # the first key set
    if "tokenizer" in spec and tokenizer is not None:
        found = tokenizer.backend.token_to_id(spec["tokenizer"])
    found = spec.get("instead", {}).get(found, found)  # a value the file's class reads otherwise
    candidates = ([found] if found is not None else []) + list(spec.get("fallback", []))
    for candidate in candidates:
        if candidate is None:
            return None
        if candidate == "last":
            return vocab_size - 1
        usable = isinstance(candidate, int) and not isinstance(candidate, bool)
        if usable and 0 <= candidate < vocab_size:
            return candidate
    return None


def _labels(config: dict[str, Any], where: str) -> list[str]:
    """A sequence classifier's class names in id order, from config.json's id2label."""
    id2label = config.get("id2label")
    if not isinstance(id2label, dict) or not id2label:
        raise CheckpointError(f"{where}: a sequence classifier needs id2label (class names)")
    try:
        ordered = sorted((int(key), str(value)) for key, value in id2label.items())
    except ValueError as exc:
        raise CheckpointError(f"{where}: id2label keys should be ids 0..n-1") from exc
    if [key for key, _ in ordered] != list(range(len(ordered))):
        raise CheckpointError(f"{where}: id2label keys should be ids 0..{len(ordered) - 1}")
    return [value for _, value in ordered]


def card_fields(layout: LayoutMap, config: dict[str, Any], names: list[str],
                tokenizer: HuggingFaceTokenizer | None, parent: Card, where: str
                ) -> tuple[dict[str, Any], dict[str, str]]:
    """Card fields read from config.json and the tensor names: (fields, {field: origin})."""
    _check_requires(layout, config, where)
    fields: dict[str, Any] = {}
    origins: dict[str, str] = {}
    for field in layout["config"]:
        found = layout.config_value(config, field)
        if found is None:  # absent: the map's `defaults`, else the parent card's value
            continue
        key, value = found
        fields[field] = _converted(layout, field, key, value, where)
        origins[field] = f"{where} ({key})"
    for field in layout["explicit_null"]:  # null there is the value (Gemma 2's caps off)
        keys = layout["config"].get(field) or []
        null = next((key for key in (keys if isinstance(keys, list) else [keys])
                     if lookup(config, key) is None), None)
        if null is not None and field not in fields:
            fields[field], origins[field] = None, f"{where} ({null})"
    for field, value in layout["defaults"].items():  # transformers' value for an absent key
        fields.setdefault(field, value)
        origins.setdefault(field, display_path(layout.path))
    for field, value in layout["fields"].items():  # the same for every file of this layout
        fields[field], origins[field] = value, display_path(layout.path)
    if "d_ff" not in fields and "d_ff_per_d_model" in layout.data and "d_model" in fields:
        fields["d_ff"] = layout.data["d_ff_per_d_model"] * fields["d_model"]
    for field, prefix in layout["heads"].items():  # which heads the checkpoint really has
        fields[field] = any(name.startswith(prefix) for name in names)
        origins[field] = f"{where} (tensors {prefix}*)"
    classifier = layout["classifier"]
    if classifier and any(name.startswith(classifier["prefix"]) for name in names):
        labels = _labels(config, where)
        pooling = config.get(classifier.get("pooling_key", "")) or classifier["pooling"]
        fields.update(num_labels=len(labels), labels=labels, pooling=pooling)
        origins.update({key: f"{where} (id2label)" for key in ("num_labels", "labels")})
        origins["pooling"] = f"{where} (tensors {classifier['prefix']}*)"
    vocab_size = fields.get("vocab_size", parent["vocab_size"])
    for field, spec in layout["tokens"].items():
        fields[field] = _token_id(spec, config, tokenizer, vocab_size)
        origins[field] = where
    return fields, origins


def nested_fields(parent: Card, fields: dict[str, Any]) -> dict[str, Any]:
    """`vision.d_model: 48` as the field `vision` (the parent's nested card) with d_model 48."""
    out: dict[str, Any] = {}
    for name, value in fields.items():
        outer, dot, inner = name.partition(".")
        if dot:
            out.setdefault(outer, dict(parent[outer] or {}))[inner] = value
        else:
            out[name] = value
    return out


def _changed(before: Any, after: Any) -> Any:
    """A nested card (a dual encoder's `vision`) as the fields that changed, else the value."""
    if isinstance(before, dict) and isinstance(after, dict):
        return {key: value for key, value in after.items() if before.get(key, MISSING) != value}
    return after


def make_card(parent: Card, name: str, fields: dict[str, Any], origins: dict[str, str],
              where: str) -> tuple[Card, dict[str, Any]]:
    """The parent card with `fields` over it, validated: (card, fields that differ)."""
    resolved = validate({**parent.fields, **nested_fields(parent, fields)}, where, origins)
    # a block's own fields (the experts') may be new to the parent
    overrides = {key: _changed(parent.fields.get(key, MISSING), value)
                 for key, value in resolved.items() if parent.fields.get(key, MISSING) != value}
    all_origins = {key: origins.get(key, parent.origins.get(key, where)) for key in resolved}
    return Card(name, Path(where), resolved, all_origins), overrides


# --- tensors: source names -> zoo names ----------------------------------------------------

@dataclass
class Mapped:
    tensors: dict[str, torch.Tensor]
    ignored: list[str]
    tied: list[str]


def _check_tied(layout: LayoutMap, named: dict[str, torch.Tensor], original: dict[str, str],
                where: str) -> list[str]:
    """Tensors the zoo ties (an LM head = the embedding): dropped when equal, refused if not.
    An entry a variant sets to null is not tied (T5 v1.1's head)."""
    tied = []
    for name, same_as in layout["tied"].items():
        if name not in named or same_as is None:
            continue
        other = named.get(same_as)
        if other is not None and (other.shape != named[name].shape
                                  or not torch.equal(other, named[name])):
            raise CheckpointError(f"{where}: {original[name]} differs from {original[same_as]}; "
                                  "the zoo ties them, so an untied head cannot be imported")
        tied.append(name)
    return tied


def _first_fitting(layout: LayoutMap, name: str, expected: dict[str, torch.Tensor]
                   ) -> tuple[Rule, list[str]] | None:
    """The first rule for `name` whose every target the model has, with those targets."""
    for rule, groups in layout.matches(name):
        targets = [target.format(**groups) for target in rule.targets]
        if all(target in expected for target in targets):
            return rule, targets
    return None


def map_tensors(layout: LayoutMap, named: dict[str, torch.Tensor], original: dict[str, str],
                expected: dict[str, torch.Tensor], where: str) -> Mapped:
    """Rename and transform every tensor; refuse in one line listing every mismatch."""
    tied = _check_tied(layout, named, original, where)
    ignored, unexpected, misshaped = [], [], []
    out: dict[str, torch.Tensor] = {}
    covered: set[str] = set()  # zoo names some tensor in the file is for, even mis-shaped
    for name, tensor in named.items():
        if name in tied:
            continue
        if any(pattern.fullmatch(name) for pattern in layout.ignore):
            ignored.append(original[name])
            continue
        found = _first_fitting(layout, name, expected)
        if found is None:  # no rule, or none whose targets the model has (a layer too many)
            unexpected.append(original[name])
            continue
        rule, targets = found
        covered.update(targets)
        needed = rule.source_shape([tuple(expected[target].shape) for target in targets])
        if tuple(tensor.shape) != needed:
            misshaped.append(f"{original[name]} {tuple(tensor.shape)} != {needed}")
            continue
        for target, value in zip(targets, apply_rule(rule, tensor), strict=True):
            out[target] = value.to(expected[target].dtype)
    missing = sorted({layout.source_of(target) for target in expected if target not in covered})
    problems = [f"{label}: {_listing(items)}" for label, items in
                (("missing", missing), ("unexpected", sorted(unexpected)),
                 ("mis-shaped (file != config.json)", misshaped)) if items]
    if problems:
        raise CheckpointError(f"{where}: " + "; ".join(problems))
    return Mapped(out, sorted(ignored), sorted(original[name] for name in tied))


# --- the whole import ----------------------------------------------------------------------

def read_tokenizer(folder: Path) -> HuggingFaceTokenizer | None:
    path = source_file(folder, HF_TOKENIZER)
    return HuggingFaceTokenizer(path) if path.is_file() else None


def check_tokenizer_fits(size: int, vocab_size: int, where: str) -> None:
    """A tokenizer whose ids run past the embedding table would index out of range."""
    if size > vocab_size:
        raise CheckpointError(f"{where}: {size} tokens, but the model's vocab_size is "
                              f"{vocab_size}")


def _check_tokenizer(tokenizer: HuggingFaceTokenizer | None, folder: Path, card: Card) -> None:
    if tokenizer is not None:
        check_tokenizer_fits(tokenizer.backend.get_vocab_size(with_added_tokens=True),
                             card["vocab_size"], display_path(folder / HF_TOKENIZER))


def layout_tokenizer_files(layout: LayoutMap, folder: Path) -> list[str]:
    """The tokenizer files a layout names (MarianMT's sentencepiece models and vocabularies):
    the required ones, refused in one line where any is missing, then the optional present."""
    spec = layout["tokenizer_files"]
    for name in spec.get("required", []) + spec.get("optional", []):
        source_file(folder, name)
    missing = [name for name in spec.get("required", []) if not (folder / name).is_file()]
    if missing:
        raise CheckpointError(f"{display_path(folder)}: no {', '.join(missing)} (a "
                              f"{layout.data['model_type']} folder has "
                              f"{', '.join(spec['required'])} beside config.json)")
    return spec.get("required", []) + [name for name in spec.get("optional", [])
                                       if (folder / name).is_file()]


def _refuse_overlap(source: Path, out: Path) -> None:
    source, out = source.resolve(), out.resolve()
    if out == source or out in source.parents:
        raise CheckpointError(f"{display_path(out)}: the output would replace the source folder")


POSITIONS = "embeddings.positions"  # a patch stem's position table (zoo/blocks/patches.py)


def _resize_image(fields: dict[str, Any], origins: dict[str, str], image_size: int | None,
                  where: str) -> int | None:
    """--image-size: the card's image_size set to it; returns the size the positions were
    trained at (None: no resize)."""
    if image_size is None:
        return None
    if "image_size" not in fields:
        raise CheckpointError(f"{where}: --image-size applies to an image model (a ViT)")
    trained = fields["image_size"]
    fields["image_size"], origins["image_size"] = image_size, "--image-size"
    return trained


def _trained_positions(card: Card, trained: int) -> torch.Tensor:
    """An empty position table of the shape the checkpoint holds (its grid at `trained`)."""
    patches = num_patches({"image_size": trained, "patch_size": card["patch_size"]})
    return torch.empty(1, patches + 1, card["d_model"])


def import_checkpoint(source: Path, out: Path, force: bool = False,
                      extra: Extra | None = None, image_size: int | None = None
                      ) -> dict[str, Any]:
    """Write `out` as a built folder (model.safetensors, config.yaml, tokenizer.json when the
    source has one, source.json); nothing is written on failure. Returns source.json's data.
    `extra(model, card, staging)` adds files of its own to the staged folder (`--adapter`'s)
    and may still refuse it. `image_size`: an image model's new size, its positions
    interpolated (`interpolated_positions`) and its processor rewritten for it."""
    source, out = Path(source), Path(out)
    refuse_existing(out, force)
    if not source.is_dir():
        raise CheckpointError(f"{display_path(source)}: no such folder")
    _refuse_overlap(source, out)
    modules = read_modules(source)  # a sentence-transformers folder: its body is a module
    root, source = source, modules.body if modules else source
    config = read_config(source)
    config_where = display_path(source / SOURCE_CONFIG)
    layout = find_map(config, config_where).for_config(config)
    check_types(config, config_kinds(layout), config_where)  # before any key is used
    weights = find_weights(source)
    weights_where = display_path(weights)
    tokenizer = read_tokenizer(source)
    text_files = layout_tokenizer_files(layout, source)
    for name in text_files:  # opened and checked before it lands in OUT
        check_tokenizer_file(source / name)

    tensors = read_tensors(weights)
    check_sizes(layout, config, tensors, config_where, weights_where)
    named, original, prefixes = normalised_tensors(layout, tensors, weights_where)
    parent = open_catalog().get(layout.data["extends"])
    fields, origins = card_fields(layout, config, list(named), tokenizer, parent, config_where)
    if modules is not None:
        fields.update(modules.fields)
        origins.update({key: display_path(root / MODULES) for key in modules.fields})
    architecture = next((name for name in config.get("architectures") or []
                         if name in layout.architectures()), layout.data["model_type"])
    fields["description"] = f"{architecture} imported from {root.resolve().name}"
    trained_size = _resize_image(fields, origins, image_size, config_where)
    card, overrides = make_card(parent, out.name, fields, origins, config_where)
    _check_tokenizer(tokenizer, source, card)
    model = build_model(card, seed=None)
    expected = model.state_dict()
    if trained_size is not None:  # the file's table is for its own grid
        expected = {**expected, POSITIONS: _trained_positions(card, trained_size)}
    mapped = map_tensors(layout, named, original, expected, weights_where)
    if trained_size is not None:
        mapped.tensors[POSITIONS] = interpolated_positions(
            mapped.tensors[POSITIONS], card["image_size"] // card["patch_size"])
    model.load_state_dict(mapped.tensors, strict=True)

    record = {
        "source": str(root.resolve()),
        "model_type": layout.data["model_type"],
        "architecture": architecture,
        "map": f"registry/maps/{layout.path.name}",
        "prefixes": prefixes,
        "safetensors": {"file": SOURCE_WEIGHTS, "sha256": sha256(weights),
                        "dtypes": sorted({str(t.dtype).removeprefix("torch.")
                                          for t in tensors.values()})},
        "extends": layout.data["extends"],
        "overrides": overrides,
        "heads": {field: card[field] for field in (*layout["heads"], "tie_embeddings")},
        "sentence": {field: card[field] for field in ("pooling", "normalize", "num_labels",
                                                      "labels")},
        "sentence_transformers": modules.record if modules else None,
        "tied": mapped.tied,
        "ignored": mapped.ignored,
        "tokenizer": HF_TOKENIZER if tokenizer is not None else (text_files or None),
    }
    written: dict[str, str] = {}
    if trained_size is None:
        processor = processor_file(source, card)  # an image model's, checked against its card
    else:
        record["positions"] = {"trained_at": trained_size, "interpolated_to": image_size,
                               "mode": "bicubic (transformers' interpolate_pos_encoding)"}
        processor, resized = None, resized_processor(source, card, trained_size)
        if resized is not None:
            written[PREPROCESSOR_CONFIG] = json.dumps(resized, indent=2) + "\n"
    if is_mel_card(card):  # Whisper's languages, tasks and timestamps, written checked
        tokens = read_speech_tokens(source, card["vocab_size"])
        written[GENERATION_CONFIG] = json.dumps(tokens.generation_config(), indent=2) + "\n"
    copied = ([HF_TOKENIZER] if tokenizer is not None else []) + text_files + (
        [processor.name] if processor is not None else []) + [
        path.name for path in speech_files(source, card) if path.name != GENERATION_CONFIG]
    _land(out, force, model, card, [source / name for name in copied], record, extra, written)
    return record


def _land(out: Path, force: bool, model: torch.nn.Module, card: Card, copied: list[Path],
          record: dict[str, Any], extra: Extra | None = None,
          written: dict[str, str] | None = None) -> None:
    """OUT in one rename: the weights and card, the tokenizer files (already opened and
    checked), the files `written` (name: text), source.json."""
    with atomic_folder(out, force) as staging:
        save_built(model, card, staging, force=True)  # replaces the empty staging folder whole
        for path in copied:
            shutil.copyfile(path, staging / path.name)
        for name, text in (written or {}).items():
            (staging / name).write_text(text, encoding="utf-8")
        if extra is not None:
            extra(model, card, staging)
        (staging / RECORD).write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")
