"""A card as a Hugging Face `config.json`: the importer's layout maps (registry/maps/*.yaml) run
backwards, then forwards again as the proof.

For each map, config.json is written from the card through the map's own `config` keys (and
its `requires`, `each` and `tokens`); then the importer reads that config back
(zoo/files/importers.py `card_fields`, `make_card`). Only where it gives back the card's every
architecture field is the map's `model_type` claimed: a card no map reproduces (gpt-tiny with
rotary positions, a Marian-like card with the paper's sinusoids) gets no config.json, and the
reason in one line. The maps know nothing twice: what the importer accepts is what is written.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from registry.blocks import block_fields, effective_bias
from registry.catalog import Card, open_catalog, read_yaml
from registry.errors import ZooError
from registry.families import spec_of
from registry.layouts import LayoutMap, known_maps
from registry.schema import FIELDS
from registry.sizes import attention_sizes
from zoo.files.importers import EVERY_N, LAYER_TYPES, card_fields, make_card

# Card fields that are not the computation: the names, training settings, token ids (written,
# but filled by the importer from its own fallbacks) and the sentence heads, checked apart.
NOT_ARCHITECTURE = {"family", "description", "dropout", "pad_token_id", "bos_token_id",
                    "eos_token_id", "mask_token_id", "pooling", "normalize", "num_labels",
                    "labels"}
STANDARD_TOKENS = ("bos_token_id", "eos_token_id", "pad_token_id")
WHERE = "config.json (written from the card)"
POOLING_KEY_VALUES = ("cls", "mean")  # what a map's classifier pooling_key may say


@dataclass
class HFConfig:
    """config.json's object, or None with the one line that says why there is none; `note`
    also says what a written config leaves out (a head no transformers class has)."""

    config: dict[str, Any] | None
    note: str | None = None


def _ordered_maps() -> list[LayoutMap]:
    """Maps of their own first (Llama before Mistral, which is Llama's layout with settings of
    its own): where two reproduce a card, the first one's name is given."""
    maps = list(known_maps().values())
    return sorted(maps, key=lambda layout: ("like" in read_yaml(layout.path),
                                            layout.path.stem))


def _first_key(keys: str | list[str]) -> str:
    """The key to write a field under: the first plain one (a dotted key reads into an object
    that transformers 5 writes; its 4.x readers, Optimum's among them, read the plain one)."""
    keys = keys if isinstance(keys, list) else [keys]
    return next((key for key in keys if "." not in key), keys[0])


def _put(config: dict[str, Any], key: str, value: Any) -> None:
    """config[key] = value, a dotted key (`text_config.hidden_size`) into nested objects."""
    *outer, last = key.split(".")
    for part in outer:
        config = config.setdefault(part, {})
    config[last] = value


def _value(layout: LayoutMap, card: Card, field: str) -> Any:
    """The card's value as config.json spells it (`vision.d_model`: the nested card's)."""
    outer, dot, inner = field.partition(".")
    if dot:  # None on a card without the nested one (its family is not the layout's)
        return None if card[outer] is None else _value(layout, card[outer], inner)
    sizes = attention_sizes(card)
    if field == "n_kv_heads":
        return sizes.kv_heads
    if field == "head_dim":
        return sizes.head_dim
    if field in ("attention_bias", "mlp_bias"):
        return effective_bias(card, field)
    if field == "attention_pattern":  # transformers 5's layer_types, one per layer
        kinds = {letter: kind for kind, letter in LAYER_TYPES.items()}
        pattern = card["attention_pattern"]
        return [kinds[pattern[i % len(pattern)]] for i in range(card["n_layers"])]
    if field == "activation":  # the first config.json name the map reads as this activation
        return next((name for name, ours in layout["activations"].items()
                     if ours == card["activation"]), card["activation"])
    if field not in (card.fields if isinstance(card, Card) else card):
        return None  # a block's own field (the experts') on a card without that block
    return card[field]


def _labels(card: Card) -> list[str]:
    return list(card["labels"] or [f"LABEL_{i}" for i in range(card["num_labels"])])


def _written(layout: LayoutMap, card: Card) -> dict[str, Any]:
    config: dict[str, Any] = {"model_type": layout.data["model_type"]}
    for field, keys in layout["config"].items():
        _put(config, _first_key(keys), _value(layout, card, field))
    config.update({key: value for key, value in layout["requires"].items()
                   if "." not in key})  # a dotted key checks inside an object transformers fills
    for key, other in layout["equal"].items():
        config[key] = config.get(other)
    for key, want in layout["each"].items():
        config[key] = [want] * card["n_layers"]
    pattern = card["attention_pattern"]
    if EVERY_N in (layout["config"].get("attention_pattern") or []) and pattern == "G" + "L" * (
            len(pattern) - 1):  # transformers 4 reads this, not layer_types (Optimum's)
        config[EVERY_N] = len(pattern)
    for field, spec in layout["tokens"].items():
        if "config" in spec and card[field] is not None:
            _put(config, _first_key(spec["config"]), card[field])
    for field in STANDARD_TOKENS:
        if card[field] is not None:
            config.setdefault(field, card[field])
    if card["num_labels"]:
        labels = _labels(card)
        config["id2label"] = {str(i): label for i, label in enumerate(labels)}
        config["label2id"] = {label: i for i, label in enumerate(labels)}
        if "pooling_key" in layout["classifier"]:  # ModernBERT's classifier_pooling
            config[layout["classifier"]["pooling_key"]] = card["pooling"]
    return config


def architecture(card: Card | dict[str, Any]) -> dict[str, Any]:
    """What the card computes, with the fields that default to another's resolved."""
    sizes = attention_sizes(card)
    fields = {name: card[name] for name in FIELDS if name not in NOT_ARCHITECTURE}
    fields.update(n_kv_heads=sizes.kv_heads, head_dim=sizes.head_dim,
                  attention_bias=effective_bias(card, "attention_bias"),
                  mlp_bias=effective_bias(card, "mlp_bias"))
    values = card.fields if isinstance(card, Card) else card
    fields.update({name: values[name] for name in block_fields() if name in values})  # experts'
    return fields


def _classifier_claimed(layout: LayoutMap, card: Card) -> bool:
    """A classifier is the layout's class only where its head reads the same sentence vector
    (BertForSequenceClassification: the pooler's, not normalized)."""
    classifier = layout["classifier"]
    if not classifier:
        return False
    poolings = (classifier["pooling"], *(POOLING_KEY_VALUES if "pooling_key" in classifier
                                          else ()))
    return bool(card["num_labels"] and card["pooling"] in poolings and not card["normalize"])


def _reproduces(layout: LayoutMap, card: Card, config: dict[str, Any]) -> bool:
    """Whether the importer reads `config` back as `card` (heads and all)."""
    names = [f"{prefix}weight" for field, prefix in layout["heads"].items() if card[field]]
    if _classifier_claimed(layout, card):
        names.append(f"{layout['classifier']['prefix']}weight")
    parent = open_catalog().get(layout.data["extends"])
    if spec_of(parent).name != spec_of(card).name:
        return False
    try:
        resolved = layout.for_config(config)
        fields, origins = card_fields(resolved, config, names, None, parent, WHERE)
        read, _ = make_card(parent, card.name, fields, origins, WHERE)
    except ZooError:  # the importer refuses this config: the layout cannot say this card
        return False
    if architecture(read) != architecture(card):
        return False
    return not _classifier_claimed(layout, card) or (
        read["num_labels"], read["labels"]) == (card["num_labels"], _labels(card))


def _class_name(layout: LayoutMap, card: Card) -> tuple[str | None, str | None]:
    """(the transformers class this card is, or None; a note where there is none)."""
    names = layout.architectures()
    endings = spec_of(card).hf_architectures
    if endings is not None:  # a generator: the class that generates
        wanted = [n for n in names if n.endswith(endings)]
    elif card["num_labels"]:
        if not _classifier_claimed(layout, card):
            return None, (f"architectures left out: a {card['pooling']}-pooled classifier is no "
                          "transformers class (the graph computes it whole)")
        wanted = [n for n in names if n.endswith(spec_of(card).hf_classifier)]
    elif card["mlm_head"]:
        wanted = [n for n in names if n.endswith("ForMaskedLM")]
    else:
        wanted = [n for n in names if n.endswith("Model") and "For" not in n]
    return (wanted[0], None) if wanted else (None, None)


def hf_config(card: Card) -> HFConfig:
    """config.json for `card`, from the first layout map that reproduces it; else none."""
    why = spec_of(card).no_hf_class
    if why is not None:
        return HFConfig(None, f"no config.json: {why} is no transformers class")
    for layout in _ordered_maps():
        config = _written(layout, card)
        if not _reproduces(layout, card, config):
            continue
        name, note = _class_name(layout, card)
        if name:
            config["architectures"] = [name]
        return HFConfig(config, note)
    known = ", ".join(sorted(known_maps()))
    return HFConfig(None, f"no config.json: the card matches no Hugging Face layout the zoo "
                          f"knows ({known})")
