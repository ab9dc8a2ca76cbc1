"""`zoo attention`: the attention maps of one prompt, from PyTorch or from an `--attentions`
export, drawn as a grid of heatmaps (heads of a layer, or layers x heads) with the tokens on
both axes, and written as JSON with the numbers drawn.

An image model (a ViT) is given `--image FILE` instead: export/inspect/image_attention.py
draws its class token over the patches and the rollout across layers.

SOURCE is a card (built with seed 0), a model folder, or an export folder. PyTorch runs the
model with its attentions recording (zoo/blocks/attention.py); ONNX Runtime needs an export made
with `--attentions`. Everything is checked before anything is computed or written.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from export.inspect.image_attention import ImageLooked, image_json, image_panels, look_image
from export.inspect.maps import AttentionGroup, maps_of
from export.opening import open_export, open_model
from registry.catalog import Card
from registry.errors import ZooError
from registry.families import spec_of
from registry.options import option, parse_ids
from registry.paths import display_path
from registry.sizes import attention_sizes
from registry.stems import is_patch_card
from runtime.contract import MANIFEST
from runtime.files.atomic import output_file, refuse_existing, write_file
from runtime.files.tokenizer import load_tokenizer, sequence_ids
from runtime.generate import generate
from runtime.prompts import check_ids, check_text
from zoo.files.sources import load_source, source_card
from zoo.files.weights import load_built
from zoo.plots.draw import Drawn, Panel, check_target, heatmap_grid, square_columns

ENGINES = ("torch", "onnx")


class AttentionError(ZooError):
    """A request `zoo attention` cannot draw: engine, tokens, layer, head or kind."""


@dataclass
class Request:
    source: str
    text: str | None = option(None, "Text prompt (a folder with a tokenizer).")
    ids: list[int] | None = option(None, "Comma-separated token ids.", parse=parse_ids)
    engine: str | None = option(None, "[onnx for an export folder (made with --attentions), "
                                "else torch]", choices=ENGINES)
    image: str | None = option(None, "An image file, for an image model (a ViT): the class "
                               "token's attention over the patches drawn on it, per head of "
                               "--layer [all: the last], and the rollout across layers.")
    layer: str = option("all", "A layer index, or all.")
    head: str = option("all", "A head index, or all.")
    kind: str | None = option(  # a group: attentions | encoder | decoder | cross
        None, "encoder-decoder: encoder, decoder or cross [cross].")
    generate: int | None = option(  # new tokens first (default: the family's)
        None, "Generate this many tokens first and show them too [0; 16 for the "
        "encoder-decoder, whose target is generated].")
    registries: tuple[str, ...] = ()


@dataclass
class Looked:
    card: Card
    engine: str
    group: AttentionGroup
    label: Callable[[int], str]
    layers: list[int]
    heads: list[int]


def _engine(request: Request) -> tuple[Any, Card, Path | None, str]:
    folder = Path(request.source)
    export = (folder / MANIFEST).is_file()
    engine = request.engine or ("onnx" if export else "torch")
    if engine not in ENGINES:
        raise AttentionError(f"--engine {engine}: expected one of {', '.join(ENGINES)}")
    if engine == "onnx":
        if not export:
            raise AttentionError(f"{request.source}: --engine onnx needs an export folder "
                                 "(zoo export NAME --onnx --attentions)")
        runtime = open_export(folder)
        if "attentions" not in runtime.manifest:
            raise AttentionError(f"{display_path(folder)}: this export has no attention "
                                 "outputs; export it again with --attentions")
        return runtime, runtime.card, folder, engine
    if export:
        model, card = load_built(folder)  # the reference weights an export carries
    else:
        model, card = load_source(request.source, request.registries)
    return open_model(model, card, attentions=True), card, folder if folder.is_dir() else None, \
        engine


def _prompt(request: Request, card: Card, folder: Path | None) -> tuple[list[int], Any]:
    tokenizer = load_tokenizer(folder) if folder is not None else None
    if (request.text is None) == (request.ids is None):
        raise AttentionError("give the prompt with --text or with --ids (one of them)")
    if request.text is not None:
        if tokenizer is None:
            raise AttentionError(f"{request.source}: no tokenizer here; pass token ids with "
                                 "--ids")
        # what `zoo run` feeds: the text with its special tokens (BOS, [CLS] ... [SEP], </s>)
        ids = sequence_ids(tokenizer, check_text(request.text))
    else:
        ids = list(request.ids or [])
    check_ids(card, [ids], "--text" if request.text is not None else "--ids")
    if not ids:
        raise AttentionError("the prompt is empty")
    return ids, tokenizer


def _pick(value: str, count: int, what: str) -> list[int]:
    if value == "all":
        return list(range(count))
    try:
        index = int(value)
    except ValueError:
        raise AttentionError(f"--{what} {value}: expected a number or 'all'") from None
    if not 0 <= index < count:
        raise AttentionError(f"--{what} {index}: the model has {what}s 0..{count - 1}")
    return [index]


def _group_name(kind: str | None, names: list[str]) -> str:
    if kind is None:
        return names[-1]  # the one a reader wants first: the decoder's cross-attention
    matches = [name for name in names if name in (kind, f"{kind}_attentions")]
    if not matches:
        short = ", ".join(name.removesuffix("_attentions") for name in names)
        raise AttentionError(f"--kind {kind}: this model has {short}")
    return matches[0]


def _look_image(request: Request, engine: Any, card: Card, folder: Path | None,
                engine_name: str) -> ImageLooked:
    if request.image is None or request.text is not None or request.ids is not None:
        raise AttentionError(f"{card.name} reads images: give --image FILE (not --text or "
                             "--ids)")
    if request.kind not in (None, "attentions") or request.generate:
        raise AttentionError(f"{card.name}: an image model has one group of maps and "
                             "generates nothing (no --kind, no --generate)")
    last = card["n_layers"] - 1
    layer = last if request.layer == "all" else _pick(request.layer, last + 1, "layer")[0]
    heads = _pick(request.head, attention_sizes(card).heads, "head")
    return look_image(engine, card, folder, engine_name, Path(request.image), layer, heads)


def _check_family(request: Request) -> None:
    """A family without maps (a dual encoder, a speech model) refused before any model loads;
    an image model's maps are its own (image_attention.py)."""
    card = source_card(request.source, request.registries)
    if not is_patch_card(card):
        maps_of(spec_of(card))


def look(request: Request) -> Looked | ImageLooked:
    """Check the request, run the engine once over the sequence (or the image), and pick the
    maps."""
    engine, card, folder, engine_name = _engine(request)
    if is_patch_card(card):
        return _look_image(request, engine, card, folder, engine_name)
    if request.image is not None:
        raise AttentionError(f"--image: {card.name} reads tokens, not images (give --text or "
                             "--ids)")
    family = engine.family
    prompt, tokenizer = _prompt(request, card, folder)
    layers = _pick(request.layer, card["n_layers"], "layer")
    heads = _pick(request.head, attention_sizes(card).heads, "head")
    new = family.spec.default_generate if request.generate is None else request.generate
    if new < 0 or (new and not family.spec.generates):
        raise AttentionError(f"--generate {new}: should be >= 0, and 0 for an encoder")
    generated: list[int] = []
    if new:
        eos = card["eos_token_id"]
        tokens = generate(engine, np.array([prompt]), None, new, eos=eos)[0].tolist()
        generated = tokens[: tokens.index(eos) + 1] if eos in tokens else tokens
    groups = maps_of(engine.spec)(engine, prompt, generated)
    name = _group_name(request.kind, [group.name for group in groups])
    group = next(group for group in groups if group.name == name)
    label = tokenizer.label if tokenizer is not None else str
    return Looked(card, engine_name, group, label, layers, heads)


def panels(looked: Looked) -> list[Panel]:
    group = looked.group
    queries = [looked.label(token) for token in group.queries]
    keys = [looked.label(token) for token in group.keys]
    return [Panel(group.maps[layer, head], f"layer {layer} head {head}", keys, queries,
                  "key", "query") for layer in looked.layers for head in looked.heads]


def as_json(looked: Looked) -> dict[str, Any]:
    group = looked.group
    return {"model": looked.card.name, "family": looked.card.family, "engine": looked.engine,
            "attention": group.name, "query_ids": group.queries, "key_ids": group.keys,
            "queries": [looked.label(t) for t in group.queries],
            "keys": [looked.label(t) for t in group.keys],
            "panels": [{"layer": layer, "head": head,
                        "weights": group.maps[layer, head].tolist()}
                       for layer in looked.layers for head in looked.heads]}


def draw_attention(request: Request, target: Path, json_path: Path | None = None,
                   force: bool = False) -> tuple[Looked | ImageLooked, Drawn]:
    """Draw the maps into the PNG `target` (and the numbers into `json_path`)."""
    check_target(target, force)
    _check_family(request)
    if json_path is not None:
        refuse_existing(json_path, force)
        if not json_path.parent.is_dir():
            raise AttentionError(f"{display_path(json_path)}: no such folder")
    with contextlib.ExitStack() as held:  # both outputs locked for the run's length
        for path in (target, json_path):
            if path is not None:
                held.enter_context(output_file(path, force))
        looked = look(request)
        title = (f"{looked.card.name}: {_what(looked)} "
                 f"({'ONNX Runtime' if looked.engine == 'onnx' else 'PyTorch'})")
        image = isinstance(looked, ImageLooked)
        drawn_panels = image_panels(looked) if image else panels(looked)
        # layer by layer, head by head, in an about-square grid
        drawn = heatmap_grid(drawn_panels, target, force=force, title=title,
                             columns=square_columns(len(drawn_panels)))
        if json_path is not None:
            numbers = image_json(looked) if image else as_json(looked)
            write_file(json_path, (json.dumps(numbers) + "\n").encode("utf-8"), force)
    return looked, drawn


def _what(looked: Looked | ImageLooked) -> str:
    return "class token over patches" if isinstance(looked, ImageLooked) else looked.group.name


def attention_command(request: Request, target: Path, json_path: Path | None = None,
                      force: bool = False) -> list[str]:
    """`zoo attention`: the maps drawn, and the line saying what was written."""
    looked, drawn = draw_attention(request, target, json_path, force)
    width, height = drawn.size
    return [f"wrote {target} ({_what(looked)}, {drawn.panels} panels, {width}x{height}, "
            f"{looked.engine})" + (f" and {json_path}" if json_path else "")]
