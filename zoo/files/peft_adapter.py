"""LoRA adapters in PEFT's layout: `adapter_config.json` and `adapter_model.safetensors`, keyed
`base_model.model.<module>.lora_A.weight` / `.lora_B.weight` under the base's transformers
module names, so `peft.PeftModel.from_pretrained(transformers_model, FOLDER)` reads them.

The module names come from the layout maps (registry/maps/*.yaml), not from a family switch:
the map that writes the card's config.json (zoo/files/hf_config.py) names each of the zoo's
linears (`layers.0.self_attention.query` -> `model.layers.0.self_attn.q_proj` for Llama's
LlamaForCausalLM, whose body the map's first prefix nests; a head the map lists under `heads`
sits beside the body: BertForMaskedLM's `cls.predictions.transform.dense`). A card no map
reproduces, or a linear the map keeps fused (GPT-2's c_attn), keeps the zoo's own module names:
the files are then PEFT's format over the zoo's modules, read back by the zoo.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file
from torch import nn

from registry.catalog import Card
from registry.errors import ZooError
from registry.families import spec_of
from registry.layouts import known_maps
from registry.paths import display_path
from zoo.blocks.lora import LoRALinear, adapters, base_state, merge_adapters
from zoo.files.hf_config import hf_config
from zoo.files.importers import read_json_object, source_file
from zoo.files.weights import WEIGHTS, read_tensors

ADAPTER_CONFIG = "adapter_config.json"
ADAPTER_WEIGHTS = "adapter_model.safetensors"
ROOT = "base_model.model."  # PeftModel's prefix over the base model's own names
PARTS = ("lora_A", "lora_B")
REFUSED_KEYS = ("rank_pattern", "alpha_pattern", "modules_to_save", "layers_to_transform",
                "layers_pattern", "lora_bias", "target_parameters", "trainable_token_indices",
                "layer_replication")  # PEFT LoRA options the zoo does not apply: refused if set


def _linears(model: nn.Module) -> list[str]:
    return [name for name, module in model.named_modules() if isinstance(module, nn.Linear)]


def _is_bare(name: str) -> bool:
    """A transformers class that is the body itself (LlamaModel), not one nesting it."""
    return name.endswith("Model") and "For" not in name and "LMHead" not in name


def module_names(card: Card, model: nn.Module) -> dict[str, str]:
    """zoo module name -> the transformers module name PEFT keys it by (every linear)."""
    linears = _linears(model)
    config = hf_config(card).config
    layout = known_maps().get(config["model_type"]) if config else None
    if layout is None:
        return {name: name for name in linears}
    classes = config.get("architectures") or [""]
    prefixes = layout.data.get("prefixes") or [""]
    body = "" if _is_bare(classes[0]) else prefixes[0]
    heads = tuple(layout.data.get("heads", {}).values())  # beside the body, never in it
    names = {}
    for name in linears:
        target = f"{name}.weight"
        match = next(((rule, pattern) for rule in layout.rules
                      for pattern in rule.target_patterns if pattern.fullmatch(target)), None)
        if match is None or match[0].transforms != ["none"] or len(match[0].targets) != 1:
            names[name] = name  # no plain counterpart (a fused or transposed tensor)
            continue
        source = match[0].source.format(**match[1].fullmatch(target).groupdict())
        nested = "" if heads and source.startswith(heads) else body  # BERT's cls.predictions.
        names[name] = nested + source.removesuffix(".weight")
    return names


def _target_modules(chosen: list[str], every: list[str]) -> list[str]:
    """PEFT's target_modules: the leaf names where they choose exactly these modules (PEFT
    matches a name's end), else the full names."""
    leaves = sorted({name.rpartition(".")[2] for name in chosen})
    picked = [name for name in every if name.rpartition(".")[2] in leaves]
    return leaves if sorted(picked) == sorted(chosen) else sorted(chosen)


def write_adapter(model: nn.Module, card: Card, folder: Path) -> dict[str, Any]:
    """adapter_config.json and adapter_model.safetensors for `model`'s adapters (all of one
    rank, alpha, dropout and scaling, as `add_adapters` makes them) into `folder`."""
    found = adapters(model)
    if not found:
        raise ZooError("no LoRA adapters to write")
    names = module_names(card, model)
    first = next(iter(found.values()))
    tensors: dict[str, torch.Tensor] = {}
    for name, module in found.items():
        for part in PARTS:
            weight = getattr(module, part).weight
            tensors[f"{ROOT}{names[name]}.{part}.weight"] = weight.detach().contiguous().cpu()
    dropout = first.lora_dropout.p if isinstance(first.lora_dropout, nn.Dropout) else 0.0
    spec = spec_of(card)  # PEFT's wrapper class: PeftModelForSeq2SeqLM's generate reads a source
    task = ("SEQ_2_SEQ_LM" if spec.cross_attention else "CAUSAL_LM"
            if spec.hf_architectures is not None else None)
    config = {
        "peft_type": "LORA", "task_type": task,
        "base_model_name_or_path": None, "r": first.rank, "lora_alpha": first.alpha,
        "lora_dropout": dropout, "use_rslora": first.rslora, "bias": "none",
        "fan_in_fan_out": False, "init_lora_weights": True, "inference_mode": True,
        "target_modules": _target_modules([names[n] for n in found], list(names.values())),
        "modules_to_save": None, "use_dora": False,
    }
    (folder / ADAPTER_CONFIG).write_text(json.dumps(config, indent=1) + "\n", encoding="utf-8")
    save_file(tensors, str(folder / ADAPTER_WEIGHTS), metadata={"format": "pt"})
    return config


def read_adapter_config(folder: Path) -> dict[str, Any]:
    config, where = read_json_object(folder, ADAPTER_CONFIG, "PEFT adapter", ZooError)
    if config.get("peft_type") != "LORA":
        raise ZooError(f"{where}: peft_type: {config.get('peft_type')!r} adapters are not "
                       "read (only LORA)")
    for key, refused in (("use_dora", True), ("fan_in_fan_out", True)):
        if config.get(key) is refused:
            raise ZooError(f"{where}: {key}: true is not supported (plain LoRA only)")
    if config.get("bias", "none") != "none":
        raise ZooError(f"{where}: bias: {config['bias']!r}: only 'none' is supported")
    for key in REFUSED_KEYS:
        if config.get(key):
            raise ZooError(f"{where}: {key}: {config[key]!r} is not supported")
    for key in ("r", "lora_alpha"):
        if not isinstance(config.get(key), int | float) or isinstance(config.get(key), bool) \
                or config[key] <= 0:
            raise ZooError(f"{where}: {key}: should be a number > 0, got {config.get(key)!r}")
    return config


def apply_adapter(model: nn.Module, card: Card, folder: Path) -> nn.Module:
    """`model` with the PEFT LoRA adapter in `folder` merged into its weights."""
    return merge_adapters(attach_adapter(model, card, folder))


def attach_adapter(model: nn.Module, card: Card, folder: Path) -> nn.Module:
    """`model` (frozen) with the PEFT LoRA adapter in `folder` on its linears, unmerged
    (LoRALinear layers), after every check of the files against the model."""
    config = read_adapter_config(folder)
    path = source_file(folder, ADAPTER_WEIGHTS)
    where = display_path(path)
    tensors = read_tensors(path)
    peft_name = module_names(card, model)
    zoo_name = {peft: zoo for zoo, peft in peft_name.items()}
    chosen: dict[str, dict[str, torch.Tensor]] = {}
    for key, tensor in tensors.items():
        body = key.removeprefix(ROOT)
        module, _, part = body.removesuffix(".weight").rpartition(".")
        module = module.removesuffix(".default")  # a name saved with its adapter's
        if not key.startswith(ROOT) or part not in PARTS or module not in zoo_name:
            raise ZooError(f"{where}: {key}: names no linear of {card.name} that an adapter "
                           "can go on")
        chosen.setdefault(zoo_name[module], {})[part] = tensor
    rank = int(config["r"])
    for name, parts in chosen.items():
        if set(parts) != set(PARTS):
            raise ZooError(f"{where}: {name}: needs both lora_A and lora_B")
        layer = model.get_submodule(name)
        expected = {"lora_A": (rank, layer.in_features), "lora_B": (layer.out_features, rank)}
        for part, shape in expected.items():
            if tuple(parts[part].shape) != shape:
                raise ZooError(f"{where}: {ROOT}{peft_name[name]}.{part}.weight: shape "
                               f"{tuple(parts[part].shape)}, expected {shape} (r={rank} in "
                               f"{ADAPTER_CONFIG})")
    for name, parts in chosen.items():
        parent_name, _, leaf = name.rpartition(".")
        parent = model.get_submodule(parent_name) if parent_name else model
        lora = LoRALinear(getattr(parent, leaf), rank, float(config["lora_alpha"]),
                          rslora=bool(config.get("use_rslora")))
        with torch.no_grad():
            for part in PARTS:
                getattr(lora, part).weight.copy_(parts[part])
        setattr(parent, leaf, lora)
    for parameter in model.parameters():
        parameter.requires_grad_(False)
    return model


def save_adapted(model: nn.Module, card: Card, folder: Path) -> dict[str, Any]:
    """A trained folder's weights with the adapter apart: model.safetensors the base's own
    (the frozen weights, as they came), the adapter in PEFT's layout beside them."""
    save_file(base_state(model), str(folder / WEIGHTS), metadata={"format": "pt"})
    return write_adapter(model, card, folder)
