"""`zoo build`, `zoo import` and `zoo train`: model folders made from a card, from a public
checkpoint, and by training."""

from __future__ import annotations

import copy
import json
import shutil
from collections.abc import Callable, Sequence
from functools import partial
from pathlib import Path
from typing import Any

import torch

from registry.catalog import Card, open_catalog
from registry.errors import ZooError
from registry.paths import display_path
from registry.stems import is_patch_card
from runtime.files.atomic import refuse_existing, wrote
from zoo.assemble import build_model
from zoo.blocks.lora import add_adapters
from zoo.files.gguf_import import import_gguf
from zoo.files.importers import import_checkpoint
from zoo.files.peft_adapter import (
    ADAPTER_CONFIG,
    ADAPTER_WEIGHTS,
    apply_adapter,
    read_adapter_config,
    save_adapted,
)
from zoo.files.sources import load_source
from zoo.files.weights import save_built
from zoo.training.checkpoints import trainable
from zoo.training.classify import INIT_RECORD, prepare_classifier
from zoo.training.image_folders import read_folder
from zoo.training.images import DIGITS, prepare_image_classifier
from zoo.training.images import check_options as check_image_options
from zoo.training.sharded_checkpoints import consolidate_folder, is_sharded
from zoo.training.tasks import refuse_folder
from zoo.training.train import Evaluated, Progress, TrainOptions, train

Note = Callable[[str], None]


def build_command(name: str, out: Path, seed: int = 0, overrides: dict[str, Any] | None = None,
                  registries: Sequence[str] = (), force: bool = False,
                  progress: Note = lambda message: None) -> list[str]:
    card = open_catalog(tuple(registries)).get(name, overrides or None)
    refuse_existing(out, force)  # before minutes of work, not after
    progress(f"building {card.name} (seed {seed})...")
    model = build_model(card, seed=seed)
    path = save_built(model, card, out, force=force)
    parts: dict[str, int] = {}
    for param_name, parameter in model.named_parameters():
        part = param_name.split(".")[0]
        parts[part] = parts.get(part, 0) + parameter.numel()
    return [f"wrote {path} and {path.parent / 'config.yaml'}",
            f"parameters: {sum(parts.values()):,}",
            *(f"  {part:<20} {count:>14,}" for part, count in parts.items())]


def import_command(source: Path, out: Path, force: bool = False,
                   adapter: Path | None = None, image_size: int | None = None) -> list[str]:
    if image_size is not None and (source.suffix == ".gguf" or is_sharded(source)):
        raise ZooError("--image-size applies to a Hugging Face image model's folder (a ViT)")
    if is_sharded(source):  # a --shard full checkpoint: consolidated, streamed
        if adapter is not None:
            raise ZooError(f"{display_path(adapter)}: --adapter is read over a Hugging Face "
                           "folder, not a sharded checkpoint")
        names = consolidate_folder(source, out, force)
        return [f"consolidated the sharded checkpoint {display_path(source)}: "
                f"{len(names)} tensors", wrote(out)]
    if source.suffix == ".gguf":
        if adapter is not None:
            raise ZooError(f"{display_path(adapter)}: --adapter is read over a Hugging Face "
                           "folder, not a GGUF file")
        return _gguf_lines(import_gguf(source, out, force), out)
    record = import_checkpoint(source, out, force,
                               None if adapter is None else partial(_add_adapter, adapter),
                               image_size)
    changed = " ".join(f"{key}={value}" for key, value in record["overrides"].items()
                       if key != "description")
    lines = [f"imported {record['architecture']} as {record['extends']} with {changed}"]
    if adapter is not None:
        config = read_adapter_config(out)
        lines.append(f"LoRA adapter from {display_path(adapter)}: r={config['r']} "
                     f"alpha={config['lora_alpha']:g} on {_listed(config.get('target_modules'))}"
                     f"; kept beside the base's weights ({ADAPTER_CONFIG}, {ADAPTER_WEIGHTS}), "
                     "merged where OUT is loaded or exported")
    if record["ignored"] or record["tied"]:
        lines.append(f"left out {len(record['ignored']) + len(record['tied'])} tensors "
                     "(buffers, tied copies, heads the zoo lacks; listed in source.json)")
    return lines + [wrote(out)]


def _save_adapted(card: Card, model: torch.nn.Module, folder: Path) -> None:
    save_adapted(model, card, folder)


def _listed(targets: Any) -> str:
    return ", ".join(map(str, targets)) if isinstance(targets, list) else str(targets)


def _add_adapter(adapter: Path, model: torch.nn.Module, card: Card, staging: Path) -> None:
    """PEFT's adapter files copied beside the imported weights, once they apply to them."""
    for name in (ADAPTER_CONFIG, ADAPTER_WEIGHTS):
        if not (adapter / name).is_file():
            raise ZooError(f"{display_path(adapter / name)}: no such file (a PEFT adapter "
                           "folder has it)")
    apply_adapter(copy.deepcopy(model), card, adapter)  # refused here: nothing lands
    for name in (ADAPTER_CONFIG, ADAPTER_WEIGHTS):
        shutil.copyfile(adapter / name, staging / name)


def _gguf_lines(record: dict[str, Any], out: Path) -> list[str]:
    lines = [f"imported {record['architecture']} as card {out.name} (over {record['extends']}'s "
             "fields; dequantized to float32)"]
    if record["tokenizer"] is None:
        lines.append("no tokenizer: the file's is neither byte-level nor SentencePiece BPE and "
                     "no tokenizer.json lies beside it, so the folder takes token ids")
    else:
        lines.append(f"tokenizer.json from {record['tokenizer']}")
    return lines + [wrote(out)]


def train_command(source: str, options: TrainOptions, registries: Sequence[str] = (),
                  progress: Progress = lambda *args: None,
                  evaluated: Evaluated = lambda *args: None,
                  note: Note = lambda message: None) -> list[str]:
    """Train a card or a model folder (`--task classify`: made a classifier for --data's
    labels first; `--task chat`: a folder with a chat template); the lines say what was
    trained and, held out, how well."""
    options.check()  # before the card is built
    model, card = load_source(source, tuple(registries), options.seed)
    files: dict[str, bytes] = {}
    if options.task == "classify" and is_patch_card(card):  # a folder per label, or digits
        check_image_options(card, options)
        if options.data is None:
            labels, data = DIGITS, "scikit-learn's 8x8 digits"
        else:
            labels, data = read_folder(options.data).labels, display_path(options.data)
        model, card, record = prepare_image_classifier(model, card, options.seed, source,
                                                       labels, data)
        files[INIT_RECORD] = (json.dumps(record, indent=1) + "\n").encode()
        note(f"classifier: {card['num_labels']} labels, the images of {data} at "
             f"{card['image_size']} x {card['image_size']}; kept {len(record['kept'])} "
             f"tensors of {source}, initialised {len(record['initialised'])}")
    elif options.task == "classify":
        if options.data is None:
            raise ZooError("--task classify needs --data FILE (JSONL or CSV of text, label)")
        refuse_folder(card, options.data)
        model, card, record = prepare_classifier(model, card, options.data, options.seed,
                                                 source)
        files[INIT_RECORD] = (json.dumps(record, indent=1) + "\n").encode()
        note(f"classifier: {card['num_labels']} labels, pooling {card['pooling']}; kept "
             f"{len(record['kept'])} tensors of {source}, initialised "
             f"{len(record['initialised'])}, dropped {len(record['dropped'])}")
    finish = None
    if options.lora is not None:  # before OUT is touched: a bad rank or target writes nothing
        total = sum(p.numel() for p in model.parameters())
        names = add_adapters(model, options.targets(), options.lora, options.lora_alpha,
                             options.lora_dropout, options.rslora, where=source)
        count = sum(p.numel() for p in trainable(model).values())
        note(f"LoRA r={options.lora} alpha={options.lora_alpha:g} on {len(names)} linears "
             f"({options.lora_targets}): training {count:,} parameters, "
             f"{100 * count / total:.2f}% of the base's {total:,}; the adapter in PEFT's "
             f"layout beside the base's weights ({ADAPTER_CONFIG}, {ADAPTER_WEIGHTS})")
        finish = partial(_save_adapted, card)
    result = train(model, card, options, progress, evaluated=evaluated, files=files,
                   finish=finish)
    if result.get("rank", 0) != 0:
        return []
    losses, target = result["losses"], options.out
    lines = [f"trained {card.name} for {result['step']} steps: loss {losses[0]:.4f} -> "
             f"{losses[-1]:.4f}; wrote {target}/"]
    if "eval" in result and options.task == "chat":
        scored = result["eval"]
        lines.append(f"held-out: loss {scored['loss']:.4f} on the {scored['tokens']} assistant "
                     f"tokens of {scored['examples']} conversations; wrote "
                     f"{target / 'eval.json'}")
    elif "eval" in result:
        scored, baseline = result["eval"], result["eval"]["majority_baseline"]
        lines.append(f"held-out: accuracy {scored['accuracy']:.3f}, macro-F1 "
                     f"{scored['macro_f1']:.3f} on {scored['examples']} rows (majority "
                     f"baseline '{baseline['label']}': accuracy {baseline['accuracy']:.3f}, "
                     f"macro-F1 {baseline['macro_f1']:.3f}); wrote {target / 'eval.json'}")
    return lines
