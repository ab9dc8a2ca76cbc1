"""`zoo import FILE.gguf`: a GGUF file (llama.cpp's format) as a zoo model folder, read through
the layout map whose `gguf` section names the file's general.architecture (registry/maps/*.yaml:
Llama's, Qwen2's, Qwen3's, Gemma 2's and 3's, Qwen3-MoE's, OLMoE's; llama.cpp writes Mistral's
as `llama`, and Mixtral's as `llama` with an expert_count, which Mixtral's section reads). Read
by gguf_header.py (every count and length in the header checked against the file's size), every
tensor dequantized to float32 by the `gguf` package.

What llama.cpp fixes rather than stores (Gemma 3's five local layers to one global, its local
rotary base, Qwen3-MoE's renormalised top k, the 27B's query scale) is the section's `fields`,
`defaults` and `wide_query_scale`. Gemma's norms, stored as 1 + w by llama.cpp's converter, are
shifted back (`shifted`); each fused expert tensor (ffn_gate_exps: experts, rows, columns) is
split into the zoo's one matrix per expert.

GGUF keeps the Hugging Face sizes under `{architecture}.*` keys and the tensors under llama.cpp's
names, both the map's. For Llama llama.cpp's converter reorders each head's query and key rows
for its interleaved rotary (`permute` in convert_hf_to_gguf.py), which `_unpermute` undoes where
the map says so (`permuted`), so that the zoo's half-split rotary sees Hugging Face's order. The
tokenizer: a `tokenizer.json` beside the file (checked, as from a folder), else the file's own
where it is GPT-2's byte-level BPE or SentencePiece's BPE (converted as transformers converts
them: gguf_tokenizer.py), else none: the folder then takes token ids, which the import says.

Beside the fp32 weights the folder keeps each quantized tensor's own blocks (gguf_blocks.py:
gguf_blocks.safetensors and .json), rows reordered as the fp32 rows are, for `zoo export
--quantize gguf` to compute with exactly what the file holds.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import torch
from tokenizers import Tokenizer

from registry.catalog import open_catalog
from registry.errors import ZooError
from registry.layouts import LayoutMap, gguf_maps, gguf_variants
from registry.paths import display_path
from registry.sizes import attention_sizes
from runtime.files.atomic import atomic_folder, refuse_existing, sha256
from runtime.files.chat import CHAT_TEMPLATE, check_chat_template
from runtime.files.tokenizer import HF_TOKENIZER
from zoo.assemble import build_model
from zoo.files.gguf_blocks import BlockStore, write_blocks
from zoo.files.gguf_header import GGUFError, GGUFFile, Tensor, read_gguf
from zoo.files.gguf_tokenizer import KINDS, gguf_tokenizer
from zoo.files.importers import (
    RECORD,
    check_tokenizer_file,
    check_tokenizer_fits,
    make_card,
    source_file,
)
from zoo.files.weights import save_built

TOKEN_KEYS = {"bos_token_id": "tokenizer.ggml.bos_token_id",  # the same for every architecture
              "eos_token_id": "tokenizer.ggml.eos_token_id",
              "pad_token_id": "tokenizer.ggml.padding_token_id"}
EMBEDDING, HEAD = "embeddings.token.weight", "head.weight"  # the zoo's names


# The keys the import reads, of the kinds it reads them as (a list where another is, a number
# where a string is: refused by the key, not a TypeError further on).
KINDS_OF_KEYS = {"general.architecture": "string", "general.name": "string",
                 "tokenizer.ggml.model": "string", "tokenizer.ggml.pre": "string",
                 "tokenizer.chat_template": "string", "tokenizer.ggml.tokens": "array[string]",
                 "tokenizer.ggml.merges": "array[string]", "tokenizer.ggml.scores": "array[float]",
                 "tokenizer.ggml.token_type": "array[integer]",
                 **{key: "integer" for key in TOKEN_KEYS.values()},
                 "tokenizer.ggml.unknown_token_id": "integer",
                 **{f"tokenizer.ggml.{key}": "bool" for key in (
                     "add_bos_token", "add_eos_token", "add_space_prefix")}}


def _reader(path: Path) -> GGUFFile:
    """The file (read_gguf: every count and length inside it, every string UTF-8), its keys
    of the kinds the import reads."""
    where = display_path(path)
    found = read_gguf(path)
    for key, kind in KINDS_OF_KEYS.items():
        field = found.fields.get(key)
        if field is not None and _kind(field.type) != kind:
            raise GGUFError(f"{where}: {key} is {field.type}, expected {kind}")
    return found


def _kind(found: str) -> str:
    """`uint32` as `integer`, `array[float32]` as `array[float]`: what the import tells
    apart."""
    inner = found.removeprefix("array[").removesuffix("]")
    general = "integer" if "int" in inner else "float" if "float" in inner else inner
    return found.replace(inner, general)


def _metadata(reader: GGUFFile) -> dict[str, Any]:
    """Every key but the tokenizer's long lists (tokens, merges, types), as Python values."""
    found = {}
    for key, field in reader.fields.items():
        if key.startswith("tokenizer.ggml.") and field.type.startswith("array"):
            continue
        found[key] = field.contents()
    return found


def file_layout(metadata: dict[str, Any], where: str) -> LayoutMap:
    """The map whose `gguf` section reads the file's general.architecture (one whose `when` key
    the file sets first: Mixtral's, a `llama` file with experts); another is refused."""
    architecture = metadata.get("general.architecture")
    for variant in gguf_variants(str(architecture)):
        value = metadata.get(variant.gguf.key(variant.gguf.when))
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return variant
    layouts = gguf_maps()
    if architecture not in layouts:
        raise GGUFError(f"{where}: general.architecture={architecture!r} is not imported "
                        f"(known: {', '.join(layouts)})")
    return layouts[architecture]


def card_fields(layout: LayoutMap, metadata: dict[str, Any], where: str) -> dict[str, Any]:
    """Card fields from the file's metadata under the map's keys, and the map's own `fields`
    (Qwen2's query/key/value biases, Qwen3's qk-norm); what the zoo cannot compute is refused
    by its key."""
    gguf = layout.gguf
    for key in map(gguf.key, gguf.refused):
        if key in metadata:
            raise GGUFError(f"{where}: {key} is set: the zoo has no such block")
    fields: dict[str, Any] = {**layout["fields"], **gguf.fields}
    for field, key in [*gguf.config.items(), *gguf.optional.items()]:
        value = metadata.get(gguf.key(key))
        if value is None and field in gguf.config:
            raise GGUFError(f"{where}: no {gguf.key(key)} (the {field} of the model)")
        if value is not None:  # GGUF stores floats as float32: the card holds that value
            fields[field] = float(np.float32(value)) if isinstance(value, float) else value
        elif field in gguf.defaults:  # llama.cpp's value where the file has none
            fields[field] = gguf.defaults[field]
    fields.update(_rope_scaling(gguf, metadata, where))
    if metadata.get(gguf.key("block_count")) in gguf.wide_query_scale:  # the width per head
        fields["query_pre_attn_scalar"] = attention_sizes(
            {"d_model": fields["d_model"], "n_heads": fields["n_heads"]}).head_dim
    fields.update({field: metadata[key] for field, key in TOKEN_KEYS.items() if key in metadata})
    fields["description"] = f"{metadata.get('general.name', gguf.architecture)} (GGUF)"
    return fields


def _rope_scaling(gguf: Any, metadata: dict[str, Any], where: str) -> dict[str, Any]:
    """The card's rope_scaling from rope.scaling.type and .factor, for the kinds the section
    reads (Gemma 3's linear scaling of its global layers); none where the file says none."""
    kind = metadata.get(gguf.key("rope.scaling.type"))
    if not gguf.rope_scaling or kind in (None, "none"):
        return {}
    factor = metadata.get(gguf.key("rope.scaling.factor"))
    if kind not in gguf.rope_scaling or not isinstance(factor, float | int):
        raise GGUFError(f"{where}: {gguf.key('rope.scaling.type')}={kind!r} with "
                        f"{gguf.key('rope.scaling.factor')}={factor!r}: the zoo reads "
                        f"{', '.join(gguf.rope_scaling)} with a factor")
    return {"rope_scaling": {"rope_type": kind, "factor": float(np.float32(factor))}}


def _unpermute(weight: np.ndarray, heads: int) -> np.ndarray:
    """Undo llama.cpp's reordering of each head's rows (pairs interleaved) back to halves."""
    rows = weight.shape[0]
    return weight.reshape(heads, rows // heads // 2, 2, *weight.shape[1:]).swapaxes(1, 2) \
        .reshape(weight.shape)


def _array(tensor: Tensor, where: str) -> np.ndarray:
    from gguf import GGMLQuantizationType
    from gguf.quants import dequantize

    shape = tuple(reversed(tensor.dims))  # GGUF lists ne0 first
    if tensor.kind in (GGMLQuantizationType.F32, GGMLQuantizationType.F16):
        return np.asarray(tensor.data, np.float32).reshape(shape)
    try:
        values = dequantize(tensor.data, tensor.kind)
    except NotImplementedError:  # integers (I32, ...), F64, a quantization gguf lacks
        raise GGUFError(f"{where}: tensor {tensor.name} is of type {tensor.kind.name}, "
                        "which the zoo does not read (it takes F32, F16 and the quantized "
                        "types gguf dequantizes)") from None
    return np.asarray(values, np.float32).reshape(shape)


def zoo_tensors(reader: GGUFFile, layout: LayoutMap, card: Any, where: str,
                shapes: dict[str, torch.Size], blocks: BlockStore | None = None,
                ) -> dict[str, torch.Tensor]:
    """The file's tensors under the zoo's names (the map's), query and key rows back in Hugging
    Face's order where the map says llama.cpp reordered them; a name the map has no place for
    is refused, one of another shape than `shapes` (the card's model's) left as it is for
    _check_tensors to refuse. `blocks` collects each quantized tensor's raw rows, reordered
    as its fp32 rows are."""
    gguf, sizes = layout.gguf, attention_sizes(card)
    found = {}
    for tensor in reader.tensors:
        matched = gguf.match(tensor.name)
        if matched is None:
            raise GGUFError(f"{where}: tensor {tensor.name} has no place in a "
                            f"{layout.data['model_type']} model ({display_path(layout.path)}, "
                            "gguf: tensors)")
        target, source = matched
        array = _array(tensor, where)
        raw = blocks.rows(tensor, array.shape) if blocks is not None else None
        if source in gguf.permuted and array.shape == shapes.get(target):
            heads = getattr(sizes, gguf.permuted[source])
            array = _unpermute(array, heads)
            raw = None if raw is None else _unpermute(raw, heads)  # whole rows of blocks
        if source in gguf.shifted:  # Gemma's norms: llama.cpp's converter stored 1 + w
            array, raw = array - np.float32(gguf.shifted[source]), None
        if "{e}" in target:  # (experts, rows, columns): one expert's matrix each
            found.update(_experts(tensor, target, array, blocks, where))
            continue
        if raw is not None:
            blocks.add(target, tensor, raw, array.shape)
        found[target] = torch.from_numpy(np.array(array, np.float32))  # writable, owned
    return found


def _experts(tensor: Tensor, target: str, array: np.ndarray, blocks: BlockStore | None,
             where: str) -> dict[str, torch.Tensor]:
    """A fused expert tensor (ffn_gate_exps: experts, d_ff, d_model) as the zoo's one matrix
    per expert, each with its own rows of quantized blocks."""
    if array.ndim != 3:
        raise GGUFError(f"{where}: tensor {tensor.name} has dimensions {list(tensor.dims)}, "
                        "expected three (the columns, the rows, the experts)")
    raw = blocks.expert_rows(tensor, array.shape) if blocks is not None else None
    found = {}
    for expert, matrix in enumerate(array):
        name = target.format(e=expert)
        if raw is not None:
            blocks.add(name, tensor, raw[expert], matrix.shape)
        found[name] = torch.from_numpy(np.array(matrix, np.float32))
    return found


def import_gguf(path: Path, out: Path, force: bool = False) -> dict[str, Any]:
    """Write `out` as a built folder from a GGUF file; returns source.json's data."""
    path, out = Path(path), Path(out)
    refuse_existing(out, force)
    where = display_path(path)
    if not path.is_file():
        raise GGUFError(f"{where}: no such file")
    reader = _reader(path)
    metadata = _metadata(reader)
    layout = file_layout(metadata, where)
    fields = card_fields(layout, metadata, where)
    parent = open_catalog().get(layout.data["extends"])
    names = {tensor.name for tensor in reader.tensors}
    fields.update(vocab_size=_vocab_size(reader, layout, where), dropout=0.0,
                  tie_embeddings=layout.gguf.source_of(HEAD) not in names)
    card, _ = make_card(parent, out.name, fields, {key: where for key in fields}, where)
    model = build_model(card, seed=None)
    expected = model.state_dict()
    blocks = BlockStore()
    tensors = zoo_tensors(reader, layout, card, where,
                          {key: value.shape for key, value in expected.items()}, blocks)
    _check_tensors(tensors, expected, layout, where)
    model.load_state_dict(tensors, strict=True)
    return _land(path, out, force, model, card, reader, layout, blocks)


def _check_tensors(tensors: dict[str, torch.Tensor], expected: dict[str, torch.Tensor],
                   layout: LayoutMap, where: str) -> None:
    """Every tensor the card's model has, in its shape, and none it lacks (a bias the card
    does not have), named as the file names them."""
    name = layout.gguf.source_of
    wrong = sorted(f"{name(key)} {tuple(t.shape)} != {tuple(expected[key].shape)}"
                   for key, t in tensors.items() if key in expected
                   and t.shape != expected[key].shape)
    missing = sorted({name(key) for key in set(expected) - set(tensors)})  # an expert's: once
    extra = sorted({name(key) for key in set(tensors) - set(expected)})
    parts = [f"{label}: {', '.join(found[:6])}" for label, found in (
        ("mis-shaped", wrong), ("missing", missing), ("no place in the card's model", extra))
        if found]
    if parts:
        raise GGUFError(f"{where}: " + "; ".join(parts))


def _vocab_size(reader: GGUFFile, layout: LayoutMap, where: str) -> int:
    field = reader.fields.get("tokenizer.ggml.tokens")
    name = layout.gguf.source_of(EMBEDDING)
    embedding = next((t for t in reader.tensors if t.name == name), None)
    if embedding is None:
        raise GGUFError(f"{where}: no {name}")
    if len(embedding.dims) != 2:
        raise GGUFError(f"{where}: tensor {name} has dimensions {list(embedding.dims)}, "
                        "expected two (the width, the rows)")
    rows = embedding.dims[-1]
    if field is not None and len(field.value) != rows:
        raise GGUFError(f"{where}: {len(field.value)} tokens, but {name} has {rows} rows")
    return rows


def _tokenizer(path: Path, reader: GGUFFile, vocab_size: int) -> tuple[bytes | None, str | None]:
    """(tokenizer.json's bytes, where they came from): a tokenizer.json beside the file
    (checked, as from a folder) first, else the file's own byte-level or SentencePiece BPE
    (gguf_tokenizer.py), else none."""
    beside = source_file(path.parent, HF_TOKENIZER)
    if beside.is_file():
        check_tokenizer_file(beside)
        content, origin = beside.read_bytes(), display_path(beside)
    else:
        converted = gguf_tokenizer(reader.fields, display_path(path))
        if converted is None:
            return None, None
        kind = reader.fields["tokenizer.ggml.model"].contents()
        content, origin = converted.encode(), f"{display_path(path)} (its {KINDS[kind]})"
    size = Tokenizer.from_str(content.decode()).get_vocab_size(with_added_tokens=True)
    check_tokenizer_fits(size, vocab_size, origin)
    return content, origin


def _land(path: Path, out: Path, force: bool, model: torch.nn.Module, card: Any,
          reader: GGUFFile, layout: LayoutMap, blocks: BlockStore) -> dict[str, Any]:
    tokenizer, origin = _tokenizer(path, reader, card["vocab_size"])
    record = {"source": str(path.resolve()), "format": "gguf", "sha256": sha256(path),
              "architecture": card["description"], "extends": layout.data["extends"],
              "layout": layout.data["model_type"], "tokenizer": origin}
    with atomic_folder(out, force) as staging:
        save_built(model, card, staging, force=True)
        write_blocks(blocks, staging)
        if tokenizer is not None:
            (staging / HF_TOKENIZER).write_bytes(tokenizer)
        template = reader.fields.get("tokenizer.chat_template")
        if tokenizer is not None and template is not None:  # for `zoo run --chat`
            staged = staging / CHAT_TEMPLATE
            staged.write_text(template.contents(), encoding="utf-8")
            try:
                check_chat_template(staged)
            except ZooError as exc:  # named by the file and key, not the staging folder's copy
                raise GGUFError(f"{display_path(path)}: tokenizer.chat_template: " + str(exc)
                                .removeprefix(f"{display_path(staged)}: ")) from exc
        (staging / RECORD).write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")
    return record
