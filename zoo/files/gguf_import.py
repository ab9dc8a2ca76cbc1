"""`zoo import FILE.gguf`: a Llama-architecture GGUF file (llama.cpp's format) as a zoo model
folder. Read with the `gguf` package (ggml's own reader), every tensor dequantized to float32.

GGUF keeps the Hugging Face sizes under `llama.*` keys and the tensors under llama.cpp's names;
llama.cpp's converter reorders each head's query and key rows for its interleaved rotary
(`permute` in convert_hf_to_gguf.py), which `_unpermute` undoes so that the zoo's half-split
rotary sees Hugging Face's order. The tokenizer: a `tokenizer.json` beside the file (checked, as
from a folder), else the file's own where it is GPT-2's byte-level BPE or SentencePiece's BPE
(converted as transformers converts them: gguf_tokenizer.py), else none: the folder then takes
token ids, which the import says.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import torch
from tokenizers import Tokenizer

from registry.catalog import open_catalog
from registry.errors import ZooError, needs_package
from registry.paths import display_path
from registry.sizes import attention_sizes
from runtime.files.atomic import atomic_folder, refuse_existing, sha256
from runtime.files.chat import CHAT_TEMPLATE, check_chat_template
from runtime.files.tokenizer import HF_TOKENIZER
from zoo.assemble import build_model
from zoo.files.gguf_tokenizer import KINDS, gguf_tokenizer
from zoo.files.importers import (
    RECORD,
    check_tokenizer_file,
    check_tokenizer_fits,
    make_card,
    source_file,
)
from zoo.files.weights import save_built

ARCHITECTURES = {"llama": "llama-tiny"}  # general.architecture -> the card it extends
CARD_KEYS = {  # card field: the architecture's GGUF key (llama.<key>)
    "n_layers": "block_count", "max_positions": "context_length",
    "d_model": "embedding_length", "d_ff": "feed_forward_length",
    "n_heads": "attention.head_count", "n_kv_heads": "attention.head_count_kv",
    "rope_theta": "rope.freq_base", "norm_eps": "attention.layer_norm_rms_epsilon",
}
TOKEN_KEYS = {"bos_token_id": "tokenizer.ggml.bos_token_id",
              "eos_token_id": "tokenizer.ggml.eos_token_id",
              "pad_token_id": "tokenizer.ggml.padding_token_id"}
REFUSED = ("rope.scaling.type", "expert_count", "attention.sliding_window")
LAYER_TENSORS = {  # llama.cpp's name in block i -> the zoo's in layer i
    "attn_norm.weight": "norms.0.weight", "ffn_norm.weight": "norms.1.weight",
    "attn_q.weight": "self_attention.query.weight", "attn_k.weight": "self_attention.key.weight",
    "attn_v.weight": "self_attention.value.weight",
    "attn_output.weight": "self_attention.out.weight",
    "ffn_gate.weight": "feed_forward.gate.weight", "ffn_up.weight": "feed_forward.up.weight",
    "ffn_down.weight": "feed_forward.down.weight",
}
MODEL_TENSORS = {"token_embd.weight": "embeddings.token.weight",
                 "output_norm.weight": "final_norm.weight", "output.weight": "head.weight"}


class GGUFError(ZooError):
    """A GGUF file the zoo cannot import as it is."""


def _reader(path: Path) -> Any:
    gguf = needs_package("gguf", display_path(path))
    try:
        return gguf.GGUFReader(str(path))
    except (OSError, ValueError, KeyError) as exc:
        raise GGUFError(f"{display_path(path)}: not a readable GGUF file: {exc}") from exc


def _metadata(reader: Any) -> dict[str, Any]:
    """Every key but the tokenizer's long lists (tokens, merges, types), as Python values."""
    found = {}
    for key, field in reader.fields.items():
        if key.startswith("tokenizer.ggml.") and len(field.data) > 1:
            continue
        found[key] = field.contents()
    return found


def card_fields(metadata: dict[str, Any], where: str) -> tuple[str, dict[str, Any]]:
    """(parent card, card fields) from the file's metadata; what the zoo cannot compute is
    refused by its key."""
    architecture = metadata.get("general.architecture")
    if architecture not in ARCHITECTURES:
        raise GGUFError(f"{where}: general.architecture={architecture!r} is not imported "
                        f"(known: {', '.join(ARCHITECTURES)})")
    for key in REFUSED:
        if f"{architecture}.{key}" in metadata:
            raise GGUFError(f"{where}: {architecture}.{key} is set: the zoo has no such block")
    fields: dict[str, Any] = {}
    for field, key in CARD_KEYS.items():
        value = metadata.get(f"{architecture}.{key}")
        if value is None:
            raise GGUFError(f"{where}: no {architecture}.{key} (the {field} of the model)")
        fields[field] = float(value) if isinstance(value, float) else value
    fields["norm_eps"] = float(np.float32(fields["norm_eps"]))  # GGUF stores it as float32
    fields.update({field: metadata[key] for field, key in TOKEN_KEYS.items() if key in metadata})
    fields["description"] = f"{metadata.get('general.name', architecture)} (GGUF)"
    return ARCHITECTURES[architecture], fields


def _unpermute(weight: np.ndarray, heads: int) -> np.ndarray:
    """Undo llama.cpp's reordering of each head's rows (pairs interleaved) back to halves."""
    rows = weight.shape[0]
    return weight.reshape(heads, rows // heads // 2, 2, *weight.shape[1:]).swapaxes(1, 2) \
        .reshape(weight.shape)


def _array(tensor: Any) -> np.ndarray:
    from gguf import GGMLQuantizationType
    from gguf.quants import dequantize

    shape = tuple(int(d) for d in reversed(tensor.shape.tolist()))  # GGUF lists ne0 first
    if tensor.tensor_type in (GGMLQuantizationType.F32, GGMLQuantizationType.F16):
        return np.asarray(tensor.data, np.float32).reshape(shape)
    return np.asarray(dequantize(tensor.data, tensor.tensor_type), np.float32).reshape(shape)


def zoo_tensors(reader: Any, card: Any, where: str) -> dict[str, torch.Tensor]:
    """The file's tensors under the zoo's names, query and key rows back in Hugging Face's
    order; a name the zoo has no place for is refused."""
    sizes = attention_sizes(card)
    heads, kv_heads = sizes.heads, sizes.kv_heads
    found = {}
    for tensor in reader.tensors:
        name = tensor.name
        target = MODEL_TENSORS.get(name)
        if target is None and name.startswith("blk."):
            _, layer, rest = name.split(".", 2)
            target = f"layers.{layer}.{LAYER_TENSORS[rest]}" if rest in LAYER_TENSORS else None
        if target is None:
            raise GGUFError(f"{where}: tensor {name} has no place in a {card.name} model")
        array = _array(tensor)
        if target.endswith("query.weight"):
            array = _unpermute(array, heads)
        elif target.endswith("key.weight"):
            array = _unpermute(array, kv_heads)
        found[target] = torch.from_numpy(np.array(array, np.float32))  # writable, owned
    return found


def import_gguf(path: Path, out: Path, force: bool = False) -> dict[str, Any]:
    """Write `out` as a built folder from a GGUF file; returns source.json's data."""
    path, out = Path(path), Path(out)
    refuse_existing(out, force)
    where = display_path(path)
    if not path.is_file():
        raise GGUFError(f"{where}: no such file")
    reader = _reader(path)
    parent_name, fields = card_fields(_metadata(reader), where)
    parent = open_catalog().get(parent_name)
    names = {tensor.name for tensor in reader.tensors}
    fields.update(vocab_size=_vocab_size(reader, where), dropout=0.0,
                  tie_embeddings="output.weight" not in names)
    card, _ = make_card(parent, out.name, fields, {key: where for key in fields}, where)
    model = build_model(card, seed=None)
    tensors = zoo_tensors(reader, card, where)
    expected = model.state_dict()
    wrong = sorted(f"{name} {tuple(t.shape)} != {tuple(expected[name].shape)}"
                   for name, t in tensors.items() if name in expected
                   and t.shape != expected[name].shape)
    missing = sorted(set(expected) - set(tensors))
    if wrong or missing:
        raise GGUFError(f"{where}: " + "; ".join(part for part in (
            f"mis-shaped: {', '.join(wrong[:6])}" if wrong else "",
            f"missing: {', '.join(missing[:6])}" if missing else "") if part))
    model.load_state_dict(tensors, strict=True)
    return _land(path, out, force, model, card, reader)


def _vocab_size(reader: Any, where: str) -> int:
    field = reader.fields.get("tokenizer.ggml.tokens")
    embedding = next((t for t in reader.tensors if t.name == "token_embd.weight"), None)
    if embedding is None:
        raise GGUFError(f"{where}: no token_embd.weight")
    rows = int(embedding.shape.tolist()[-1])
    if field is not None and len(field.data) != rows:
        raise GGUFError(f"{where}: {len(field.data)} tokens, but token_embd.weight has "
                        f"{rows} rows")
    return rows


def _tokenizer(path: Path, reader: Any, vocab_size: int) -> tuple[bytes | None, str | None]:
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
          reader: Any) -> dict[str, Any]:
    tokenizer, origin = _tokenizer(path, reader, card["vocab_size"])
    record = {"source": str(path.resolve()), "format": "gguf", "sha256": sha256(path),
              "architecture": card["description"], "extends": ARCHITECTURES["llama"],
              "tokenizer": origin}
    with atomic_folder(out, force) as staging:
        save_built(model, card, staging, force=True)
        if tokenizer is not None:
            (staging / HF_TOKENIZER).write_bytes(tokenizer)
        template = reader.fields.get("tokenizer.chat_template")
        if tokenizer is not None and template is not None:  # for `zoo run --chat`
            (staging / CHAT_TEMPLATE).write_text(template.contents(), encoding="utf-8")
            check_chat_template(staging / CHAT_TEMPLATE)
        (staging / RECORD).write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")
    return record
