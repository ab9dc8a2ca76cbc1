"""Foreign checkpoint layouts (`registry/maps/*.yaml`), parsed without torch.

Each map says which card a Hugging Face `model_type` extends, how its config.json keys become
card fields, and how its tensor names become zoo names. A map may be `like` another (Mistral and
Qwen are Llama's layout with settings of their own): its sections go over that map's. A map
also says the layout's names in llama.cpp's GGUF files (`gguf`) and ONNX Runtime GenAI's model
type for it (`genai`). This module only reads and checks the maps; `zoo/files/importers.py` and
`zoo/files/gguf_import.py` apply them to tensors, `export/targets/genai.py` writes the type.
"""

from __future__ import annotations

import copy
import re
from dataclasses import dataclass
from dataclasses import field as dataclass_field
from pathlib import Path
from typing import Any

from registry.catalog import SHIPPED, read_yaml
from registry.errors import ZooError
from registry.paths import display_path

MAPS = SHIPPED.parent / "maps"
PLACEHOLDERS = {"i": r"\d+", "p": r"weight|bias"}  # `{i}`: a layer index; `{p}`: weight or bias
PLACEHOLDERS["e"] = r"\d+"  # `{e}`: an expert's index in a mixture of experts

# The transforms a map may name, each backwards on shapes: the shape a source tensor needs to
# give the target shapes, so a tensor is checked before it is transformed and a mismatch is
# named in the file's terms. The forward transforms on tensors live with the importer.
UNDO_SHAPES = {
    "none": lambda shapes: shapes,
    "transpose": lambda shapes: [shape[::-1] for shape in shapes],
    "split_qkv": lambda shapes: [(sum(shape[0] for shape in shapes), *shapes[0][1:])],
    "row": lambda shapes: [(1, *shape) for shape in shapes],  # (1, n) -> (n,)
    "split_halves": lambda shapes: [(sum(shape[0] for shape in shapes), *shapes[0][1:])],
    "batch": lambda shapes: [shape[1:] for shape in shapes],  # (...) -> (1, ...)
}


# The attention sizes (registry/sizes.py) a GGUF `permuted` entry may name: the heads whose
# rows llama.cpp reordered.
PERMUTED_HEADS = ("heads", "kv_heads")
GGUF_SECTIONS = ("architecture", "config", "tensors")  # every `gguf` section has these


MISSING = object()  # a config.json key that is absent (null is a value: `rope_scaling: null`)


class LayoutError(ZooError):
    """A map file that is malformed."""


def lookup(config: dict[str, Any], key: str) -> Any:
    """config.json's value at `key`, or MISSING; a dotted key reads into nested objects
    (transformers 5 keeps rope_theta and the rope type under `rope_parameters`)."""
    value: Any = config
    for part in key.split("."):
        if not isinstance(value, dict) or part not in value:
            return MISSING
        value = value[part]
    return value


def merged(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    """`over`'s sections on `base`'s: a mapping (config, fields, requires, ...) merged key by
    key, any other section (tensors, variants, ...) replaced whole."""
    out = dict(base)
    for section, value in over.items():
        below = base.get(section)
        out[section] = {**below, **value} if isinstance(value, dict) and isinstance(
            below, dict) else value
    return out


def compile_pattern(pattern: str) -> re.Pattern[str]:
    regex = re.escape(pattern)
    for name, value in PLACEHOLDERS.items():
        regex = regex.replace(re.escape(f"{{{name}}}"), f"(?P<{name}>{value})")
    return re.compile(regex)


@dataclass
class Rule:
    source: str
    targets: list[str]
    transforms: list[str]

    def __post_init__(self) -> None:
        self.pattern = compile_pattern(self.source)
        self.target_patterns = [compile_pattern(target) for target in self.targets]

    def source_shape(self, target_shapes: list[tuple[int, ...]]) -> tuple[int, ...]:
        shapes = target_shapes
        for name in reversed(self.transforms):
            shapes = UNDO_SHAPES[name](shapes)
        return tuple(shapes[0])


@dataclass
class GGUFLayout:
    """A map's `gguf` section: the metadata keys (under `{architecture}.`) and tensor names
    llama.cpp gives this layout in a GGUF file."""

    architecture: str  # general.architecture
    config: dict[str, str]  # card field: metadata key, required
    optional: dict[str, str]  # card field: metadata key, where the file has it
    refused: list[str]  # metadata keys the zoo has no block for
    permuted: dict[str, str]  # source pattern: the heads whose rows llama.cpp reordered
    rules: list[Rule]  # llama.cpp's name -> the zoo's
    # card field: value llama.cpp fixes for every file of this architecture (Gemma 3's five
    # local layers to one global, Qwen3-MoE's renormalised top k)
    fields: dict[str, Any] = dataclass_field(default_factory=dict)
    defaults: dict[str, Any] = dataclass_field(default_factory=dict)  # an optional key's, absent
    shifted: dict[str, float] = dataclass_field(default_factory=dict)  # source: what was added
    # a metadata key whose whole number > 0 makes this section, not the architecture's plain
    # one, read the file (llama.cpp writes Mixtral as `llama` with an expert_count)
    when: str | None = None
    # block counts at which llama.cpp scales queries by the model's width per query head
    # (^-0.5), not by key_length's (its Gemma 27B, told by the layer count)
    wide_query_scale: list[int] = dataclass_field(default_factory=list)
    rope_scaling: list[str] = dataclass_field(default_factory=list)  # rope.scaling.type's read

    def key(self, name: str) -> str:
        return f"{self.architecture}.{name}"

    def match(self, name: str) -> tuple[str, str] | None:
        """(the zoo's name, the source pattern) for llama.cpp's tensor `name`, or None."""
        for rule in self.rules:
            found = rule.pattern.fullmatch(name)
            if found:  # an expert's `{e}` stays where the source holds every expert
                return rule.targets[0].format(**{"e": "{e}", **found.groupdict()}), rule.source
        return None

    def source_of(self, target: str) -> str:
        """llama.cpp's name for zoo tensor `target` (as given where there is none)."""
        for rule in self.rules:
            found = rule.target_patterns[0].fullmatch(target)
            if found:
                return rule.source.format(**found.groupdict())
        return target


GGUF_MAPPINGS = ("config", "optional", "fields", "defaults", "shifted")
GGUF_LISTS = ("refused", "wide_query_scale", "rope_scaling")


def _check_kinds(section: dict, where: str) -> None:
    """A map's optional `gguf` keys of the kind the import reads (a plugin's map with a list
    where a mapping goes is one line, not a traceback at import time)."""
    for key in GGUF_MAPPINGS:
        if not isinstance(section.get(key) or {}, dict):
            raise LayoutError(f"{where}: gguf: {key} should be a mapping")
    for key in GGUF_LISTS:
        if not isinstance(section.get(key) or [], list):
            raise LayoutError(f"{where}: gguf: {key} should be a list")
    if not isinstance(section.get("when") or "", str):
        raise LayoutError(f"{where}: gguf: when should name one key of the file")


def gguf_layout(section: Any, where: str) -> GGUFLayout:
    """A `gguf` section checked: its sections there, each tensor named once, `permuted`
    naming tensors of the section and heads registry/sizes.py knows."""
    if not isinstance(section, dict) or not set(GGUF_SECTIONS) <= set(section):
        raise LayoutError(f"{where}: gguf: needs {', '.join(GGUF_SECTIONS)}")
    tensors, permuted = section["tensors"], section.get("permuted") or {}
    if not isinstance(tensors, dict) or not isinstance(permuted, dict):
        raise LayoutError(f"{where}: gguf: tensors and permuted should map names to names")
    for source, heads in permuted.items():
        if source not in tensors or heads not in PERMUTED_HEADS:
            raise LayoutError(f"{where}: gguf: permuted: {source}: {heads} should name one of "
                              f"its tensors and one of {', '.join(PERMUTED_HEADS)}")
    rules = [Rule(source, [target], ["none"]) for source, target in tensors.items()]
    _check_kinds(section, where)
    shifted = section.get("shifted") or {}
    if not set(shifted) <= set(tensors) or not all(
            isinstance(value, int | float) for value in shifted.values()):
        raise LayoutError(f"{where}: gguf: shifted should map some of its tensors to numbers")
    return GGUFLayout(str(section["architecture"]), dict(section["config"]),
                      dict(section.get("optional") or {}), list(section.get("refused") or []),
                      dict(permuted), rules, dict(section.get("fields") or {}),
                      dict(section.get("defaults") or {}), dict(shifted), section.get("when"),
                      list(section.get("wide_query_scale") or []),
                      list(section.get("rope_scaling") or []))


class LayoutMap:
    """One `registry/maps/*.yaml`: a foreign layout and how it becomes a zoo card and tensors."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.data = self._read(path, ())
        where = display_path(path)
        for key in ("model_type", "extends", "config", "tensors"):
            if key not in self.data:
                raise LayoutError(f"{where}: missing key '{key}'")
        self.rules = [self._rule(entry, where) for entry in self.data["tensors"]]
        self.ignore = [compile_pattern(pattern) for pattern in self.data.get("ignore", [])]
        self.like = read_yaml(path).get("like")  # the map this one's sections go over
        self.gguf = gguf_layout(self.data["gguf"], where) if "gguf" in self.data else None
        if not isinstance(self.data.get("genai", ""), str):
            raise LayoutError(f"{where}: genai: should be ONNX Runtime GenAI's model type name")

    @staticmethod
    def _read(path: Path, seen: tuple[str, ...]) -> dict[str, Any]:
        """The map's data over that of the map its `like` names (in the same folder)."""
        data = read_yaml(path)
        base = data.pop("like", None)
        if base is None:
            return data
        base_path = path.parent / f"{base}.yaml"
        if not isinstance(base, str) or "/" in base or base in seen or not base_path.is_file():
            raise LayoutError(f"{display_path(path)}: like: {base!r} should name another map "
                              f"in {display_path(path.parent)}")
        return merged(LayoutMap._read(base_path, (*seen, path.stem)), data)

    @staticmethod
    def _rule(entry: dict[str, Any], where: str) -> Rule:
        if not isinstance(entry, dict) or not {"source", "target"} <= set(entry):
            raise LayoutError(f"{where}: tensors: {entry!r} needs a source and a target")
        targets = entry["target"] if isinstance(entry["target"], list) else [entry["target"]]
        transforms = entry.get("transform", "none")
        transforms = transforms if isinstance(transforms, list) else [transforms]
        unknown = [name for name in transforms if name not in UNDO_SHAPES]
        if unknown:
            raise LayoutError(f"{where}: {entry['source']}: unknown transform "
                              f"{', '.join(unknown)} (known: {', '.join(UNDO_SHAPES)})")
        return Rule(entry["source"], targets, transforms)

    def for_config(self, config: dict[str, Any]) -> LayoutMap:
        """This map with each `variants` entry whose `if` values config.json has merged over
        its sections (`config`, `fields`, `tied`, ...): one map, several checkpoint styles."""
        resolved = copy.copy(self)
        resolved.data = dict(self.data)
        for variant in self.data.get("variants", []):
            if all(lookup(config, key) == value for key, value in variant["if"].items()):
                sections = {key: value for key, value in variant.items() if key != "if"}
                resolved.data = merged(resolved.data, sections)
        return resolved

    def config_value(self, config: dict[str, Any], field: str) -> tuple[str, Any] | None:
        """(key, value) of the first of card field `field`'s config.json keys (one, or a list
        of them, first found first) that is set, not null; None where none is."""
        keys = self["config"].get(field) or []
        for key in keys if isinstance(keys, list) else [keys]:
            value = lookup(config, key)
            if value is not MISSING and value is not None:
                return key, value
        return None

    def __getitem__(self, key: str) -> Any:
        return self.data.get(key) or {}

    def genai_type(self) -> str | None:
        """ONNX Runtime GenAI's model type for an export of this layout, where it has one."""
        return self.data.get("genai")

    def architectures(self) -> list[str]:
        return list(self.data.get("architectures", []))

    def match(self, name: str) -> tuple[Rule, dict[str, str]] | None:
        for rule in self.rules:
            found = rule.pattern.fullmatch(name)
            if found:
                return rule, found.groupdict()
        return None

    def matches(self, name: str) -> list[tuple[Rule, dict[str, str]]]:
        """Every rule for source `name`, in the map's order (ModernBERT's `head.dense` is the
        MLM head's or the classifier's, whichever the model has)."""
        return [(rule, found.groupdict()) for rule in self.rules
                if (found := rule.pattern.fullmatch(name))]

    def source_of(self, target: str) -> str:
        """The source tensor name that would fill zoo tensor `target`, for error messages."""
        for rule in self.rules:
            for pattern in rule.target_patterns:
                found = pattern.fullmatch(target)
                if found:
                    return rule.source.format(**found.groupdict())
        return target

    def normalise(self, name: str) -> tuple[str, str | None]:
        """Strip the model-class prefix and apply aliases: (name, prefix removed or None)."""
        prefix = next((p for p in self.data.get("prefixes", []) if name.startswith(p)), None)
        if prefix:
            name = name[len(prefix):]
        for old, new in self["aliases"].items():
            if name.endswith(old):
                name = name[: -len(old)] + new
        return name, prefix


def known_maps() -> dict[str, LayoutMap]:
    maps = [LayoutMap(path) for path in sorted(MAPS.glob("*.yaml"))]
    return {layout.data["model_type"]: layout for layout in maps}


def gguf_maps() -> dict[str, LayoutMap]:
    """general.architecture: the map that reads such a GGUF file. A map of its own comes
    before one `like` it: llama.cpp writes Mistral's files as `llama`, which Llama's map reads."""
    found: dict[str, LayoutMap] = {}
    for layout in sorted(known_maps().values(), key=lambda m: (m.like is not None, m.path.stem)):
        if layout.gguf is not None and layout.gguf.when is None:
            found.setdefault(layout.gguf.architecture, layout)
    return found


def gguf_variants(architecture: str) -> list[LayoutMap]:
    """The maps whose `gguf` section reads a file of `architecture` where its `when` key is
    set (Mixtral's: `llama` with experts), in name order."""
    return [layout for _, layout in sorted(known_maps().items())
            if layout.gguf is not None and layout.gguf.when is not None
            and layout.gguf.architecture == architecture]
