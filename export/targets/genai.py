"""ONNX Runtime GenAI: `genai_config.json` for a decoder export, and for `--optimize` exports the
shared-cache graph in the form GenAI's own loop drives (`model_genai.onnx`).

GenAI runs model type `decoder` on the contract graph unchanged: its default input and output
names are the contract's. Where a layout map (registry/maps/*.yaml) reproduces the card, the
type is that map's `genai` (llama, qwen2, qwen3); the names are given in the config either
way. It pads a batch on the right and numbers positions from 0, which the contract graph
computes exactly (positions are an input, the mask covers past + new tokens).

`model_kv.onnx` (export/onnx/shared_cache.py) takes `seqlens_k` and `total_sequence_length` and
returns each row's last logits as (B, V); GenAI feeds `attention_mask` and reads (B, T, V) or,
when the graph returns one position, (B, 1, V). `model_genai.onnx` is the same graph with those
two inputs computed from `attention_mask` (as GenAI's own model builder does) and the logits
given a sequence axis of 1; its weights are model_kv.onnx's, stored once in weights.onnx.data.
With `past_present_share_buffer` GenAI binds each present.* to its past_key_values.* buffer of
max_length positions, which is what GroupQueryAttention appends to in place.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, helper

from registry.errors import ZooError
from registry.layouts import known_maps
from registry.paths import display_path, inside
from registry.sizes import attention_sizes
from runtime.contract import CACHE_INPUT, CACHE_OUTPUT
from zoo.files.hf_config import hf_config

GENAI_CONFIG = "genai_config.json"
GENAI_GRAPH = "onnx/model_genai.onnx"
MODEL_TYPE = "decoder"  # GenAI's generic decoder-only type, where no map says another
NAMES = {  # GenAI's config key -> the contract name (templates take the layer for %d)
    "inputs": {"input_ids": "input_ids", "attention_mask": "attention_mask",
               "position_ids": "position_ids",
               "past_key_names": f"{CACHE_INPUT}.%d.key",
               "past_value_names": f"{CACHE_INPUT}.%d.value"},
    "outputs": {"logits": "logits", "present_key_names": f"{CACHE_OUTPUT}.%d.key",
                "present_value_names": f"{CACHE_OUTPUT}.%d.value"},
}
KV_LENGTHS = ("seqlens_k", "total_sequence_length")  # model_kv.onnx's inputs GenAI lacks


@dataclass
class GenAIFiles:
    """What a decoder export adds for GenAI: graphs (written with the others, so weights are
    shared) and the config, written by `write` after the graphs."""

    config: dict[str, Any]
    graphs: dict[str, onnx.ModelProto] = field(default_factory=dict)

    def write(self, folder: Path) -> list[str]:
        """genai_config.json; its tokenizer files are the export's own
        (export/targets/tokenizer_files.py, written for every family)."""
        (Path(folder) / GENAI_CONFIG).write_text(json.dumps(self.config, indent=2) + "\n",
                                                 encoding="utf-8")
        return [GENAI_CONFIG]


def genai_batch(folder: Path, prompts: list[list[int]]) -> np.ndarray:
    """Prompts as GenAI's `append_tokens` takes a batch for the export in `folder`: int32
    (B, T), padded on the right with its genai_config's pad_token_id. GenAI finds padding only
    as trailing ids equal to that one (it scans each row from the end): leading pad ids, or any
    other id, are read as tokens with positions from 0, and the row is no longer its prompt."""
    config = inside(folder, GENAI_CONFIG, display_path(Path(folder)), "GenAI's config")
    pad = json.loads(config.read_text(encoding="utf-8"))["model"]["pad_token_id"]
    if any(not p or p[-1] == pad for p in prompts):
        raise ZooError(f"GenAI would take a prompt's trailing pad id {pad} for padding")
    width = max(len(p) for p in prompts)
    return np.array([p + [pad] * (width - len(p)) for p in prompts], np.int32)


def decoder_genai(card: Any, graphs: dict[str, onnx.ModelProto], kv_file: str,
                  model_file: str) -> GenAIFiles:
    """GenAI's files for a decoder export: the shared-cache graph when the export has one
    (`kv_file`), else the contract graph, stored as `model_file` (onnx/model.onnx, or a
    quantized export's dtype name)."""
    if kv_file in graphs:
        graph = shared_cache_for_genai(graphs[kv_file])
        return GenAIFiles(genai_config(card, GENAI_GRAPH, graph, share_buffer=True),
                          {GENAI_GRAPH: graph})
    return GenAIFiles(genai_config(card, model_file, graphs[model_file], share_buffer=False))


def model_type(card: Any) -> str:
    """GenAI's model type: the `genai` of the layout map that reproduces the card (the one
    whose config.json the export writes, zoo/files/hf_config.py), else its generic decoder."""
    config = hf_config(card).config
    layout = known_maps().get(config["model_type"]) if config else None
    return (layout.genai_type() if layout else None) or MODEL_TYPE


def genai_config(card: Any, file: str, graph: onnx.ModelProto,
                 share_buffer: bool) -> dict[str, Any]:
    """genai_config.json; every name it gives is checked against `graph`'s own."""
    names = {kind: dict(entries) for kind, entries in NAMES.items()}
    _check_names(graph, names, card["n_layers"], file)
    sizes = attention_sizes(card)
    return {
        "model": {
            "type": model_type(card),
            "vocab_size": card["vocab_size"],
            "context_length": card["max_positions"],
            "bos_token_id": card["bos_token_id"],
            "eos_token_id": card["eos_token_id"],
            "pad_token_id": card["pad_token_id"],
            "decoder": {
                "filename": file,
                "session_options": {"log_id": "onnxruntime-genai", "provider_options": []},
                "hidden_size": card["d_model"],
                "num_attention_heads": sizes.heads,
                "num_key_value_heads": sizes.kv_heads,
                "head_size": sizes.head_dim,
                "num_hidden_layers": card["n_layers"],
                **names,
            },
        },
        "search": {  # greedy, like `zoo run` without options
            "do_sample": False, "num_beams": 1, "num_return_sequences": 1,
            "max_length": card["max_positions"], "min_length": 0,
            "temperature": 1.0, "top_k": 50, "top_p": 1.0, "repetition_penalty": 1.0,
            "length_penalty": 1.0, "diversity_penalty": 0.0, "no_repeat_ngram_size": 0,
            "early_stopping": True, "past_present_share_buffer": share_buffer,
        },
    }


def _check_names(graph: onnx.ModelProto, names: dict[str, dict[str, str]], layers: int,
                 file: str) -> None:
    found = {"inputs": {i.name for i in graph.graph.input},
             "outputs": {o.name for o in graph.graph.output}}
    for kind, entries in names.items():
        for name in entries.values():
            expected = [name % i for i in range(layers)] if "%d" in name else [name]
            missing = [n for n in expected if n not in found[kind]]
            if missing:
                raise ZooError(f"{file}: GenAI expects {kind[:-1]} {missing[0]!r}, the graph "
                               "has none")


def shared_cache_for_genai(kv: onnx.ModelProto) -> onnx.ModelProto:
    """model_kv.onnx as GenAI drives it: `attention_mask` (B, total) in, from which
    seqlens_k = sum(mask) - 1 and total_sequence_length = mask width; logits (B, 1, V) out."""
    graph = onnx.ModelProto()
    graph.CopyFrom(kv)
    g = graph.graph
    inputs = {i.name: i for i in g.input}
    if any(name not in inputs for name in KV_LENGTHS) or "logits" not in {o.name for o in g.output}:
        raise ZooError("model_kv.onnx: not the shared-cache graph GenAI's variant is made from")
    batch = inputs["input_ids"].type.tensor_type.shape.dim[0].dim_param
    mask = helper.make_tensor_value_info("attention_mask", TensorProto.INT64,
                                         [batch, "total_sequence_length"])
    kept = [i for i in g.input if i.name not in KV_LENGTHS]
    del g.input[:]
    g.input.extend([kept[0], mask, *kept[1:]])  # input_ids, attention_mask, position_ids, cache
    g.initializer.extend([helper.make_tensor("genai.one", TensorProto.INT64, [], [1]),
                          helper.make_tensor("genai.axis0", TensorProto.INT64, [1], [0]),
                          helper.make_tensor("genai.axis1", TensorProto.INT64, [1], [1])])
    lengths = [
        helper.make_node("ReduceSum", ["attention_mask", "genai.axis1"], ["genai.real"],
                         keepdims=0),
        helper.make_node("Sub", ["genai.real", "genai.one"], ["genai.seqlens"]),
        helper.make_node("Cast", ["genai.seqlens"], ["seqlens_k"], to=TensorProto.INT32),
        helper.make_node("Shape", ["attention_mask"], ["genai.width"], start=1, end=2),
        helper.make_node("Squeeze", ["genai.width", "genai.axis0"], ["genai.total"]),
        helper.make_node("Cast", ["genai.total"], ["total_sequence_length"],
                         to=TensorProto.INT32),
    ]
    for position, node in enumerate(lengths):
        g.node.insert(position, node)
    for node in g.node:  # the last-token logits (B, V) get a sequence axis of 1
        node.output[:] = ["genai.logits" if name == "logits" else name for name in node.output]
    g.node.append(helper.make_node("Unsqueeze", ["genai.logits", "genai.axis1"], ["logits"]))
    kv_logits = next(o for o in g.output if o.name == "logits").type.tensor_type
    vocab = kv_logits.shape.dim[1]
    logits = helper.make_tensor_value_info("logits", kv_logits.elem_type,  # float16 in fp16
                                           [batch, 1, vocab.dim_value or vocab.dim_param])
    outputs = [logits if o.name == "logits" else o for o in g.output]
    del g.output[:]
    g.output.extend(outputs)
    return graph
