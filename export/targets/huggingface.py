"""What makes an export folder also a Hugging Face model folder, which transformers.js, Optimum's
ORTModelFor* classes and sentence-transformers (`backend="onnx"`) load as it is.

- `config.json`: the card in a transformers layout's terms (zoo/files/hf_config.py: written
  only where the importer reads it back as this card), with `id2label` for a classifier and
  `transformers.js_config.dtype` naming the graph transformers.js opens when it is given no
  `dtype` (`fp32`: the suffix-less `onnx/model.onnx`, where its browser default, `q8`, would
  look for `onnx/model_quantized.onnx`; a quantized export's dtype: `q4` for
  `onnx/model_q4.onnx`; per file where the files differ, by their names without `.onnx`).
- `generation_config.json` (decoders, encoder-decoders): the special tokens and greedy
  decoding, as `zoo run` (an encoder-decoder's start token; no forced end token).
- the tokenizer files (export/targets/tokenizer_files.py), where the export has a tokenizer.
- `preprocessor_config.json`: an image model's (ViTImageProcessor) or a speech model's
  (WhisperFeatureExtractor), the source's where it had one, else made from the card.
- `modules.json`, `1_Pooling/config.json`, `sentence_bert_config.json` (encoders with a
  sentence vector sentence-transformers computes: cls, mean or last pooling; quantized, its
  `model_kwargs.file_name` names the graph's file).

The graph itself is `onnx/model.onnx` (runtime/contract.py), where transformers.js looks
(`subfolder` "onnx") and Optimum finds it by name among `**/*.onnx`; an encoder-decoder's are
`onnx/encoder_model.onnx` and `onnx/decoder_model_merged.onnx` (export/targets/seq2seq_layout.py).
Quantized, each is stored under transformers.js's name for its dtype (contract.py's
quantized_name).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from export.onnx.files import data_file_name
from export.targets.tokenizer_files import write_tokenizer_files
from registry.catalog import Card
from registry.dual import image_tower
from registry.families import spec_of
from registry.stems import is_mel_card
from runtime.contract import CLIENT_FOLDER, HALF_DTYPES, MODEL_GRAPH, client_dtype
from runtime.files.audio import write_preprocessor_config
from runtime.files.images import PREPROCESSOR_CONFIG, default_config
from runtime.speech_tokens import card_mel_settings, speech_generation
from zoo.files.hf_config import hf_config
from zoo.files.sentence_transformers import SENTENCE_CONFIG, modules_files

CONFIG_JSON = "config.json"
GENERATION_CONFIG = "generation_config.json"


def _write_json(path: Path, content: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(content, indent=2) + "\n", encoding="utf-8")


def generation_config(card: Card) -> dict[str, Any]:
    config = {"bos_token_id": card["bos_token_id"], "eos_token_id": card["eos_token_id"],
              "pad_token_id": card["pad_token_id"], "do_sample": False,
              "max_length": card["max_positions"]}
    spec = spec_of(card)
    if spec.cross_attention:  # the target starts at the card's bos
        config["decoder_start_token_id"] = card["bos_token_id"]
    return {**config, **spec.generation_extras}


def transformers_js_dtype(graphs: list[str], stored_as: dict[str, str]) -> str | dict[str, str]:
    """config.json's `transformers.js_config.dtype`: the dtype each client graph is stored
    under, one string when they share it, else by file name without `.onnx` (transformers.js's
    per-file form, e.g. {"encoder_model": "q8", "decoder_model_merged": "fp32"})."""
    dtypes = {Path(file).stem: client_dtype(file, stored_as.get(file, file))
              for file in graphs if file.startswith(CLIENT_FOLDER)}
    shared = set(dtypes.values())
    return shared.pop() if len(shared) == 1 else dtypes


def external_data_graphs(folder: Path, graphs: list[str], stored_as: dict[str, str]
                         ) -> dict[str, int]:
    """{stored file name: 1} for each client graph whose weights lie in its own
    `NAME.onnx_data` (a graph past protobuf's 2 GB), as transformers.js's
    `use_external_data_format` names them (one chunk each)."""
    found = {}
    for file in graphs:
        stored = stored_as.get(file, file)
        if stored.startswith(CLIENT_FOLDER) and (folder / stored).with_name(
                data_file_name(stored)).is_file():
            found[Path(stored).name] = 1
    return found


def write_processor_config(folder: Path, card: Card) -> None:
    """An image model's preprocessor_config.json (transformers.js and Optimum read it beside
    config.json): the one copied from its source folder, else ViTImageProcessor's settings at
    the card's image size (a dual encoder's: its vision tower's)."""
    tower = image_tower(card)
    if tower is not None and not (folder / PREPROCESSOR_CONFIG).is_file():
        _write_json(folder / PREPROCESSOR_CONFIG, default_config(tower["image_size"]))


def write_hf_files(folder: Path, card: Card, graphs: list[str],
                   stored_as: dict[str, str]) -> list[str]:
    """Write the files into the staged export `folder` (its graphs already there, a quantized
    client graph where `stored_as` says); the lines to show (why there is no config.json,
    what it or the tokenizer files leave out)."""
    folder = Path(folder)
    _, notes = write_tokenizer_files(folder, card)
    write_processor_config(folder, card)
    if is_mel_card(card) and not (folder / PREPROCESSOR_CONFIG).is_file():  # built from seed
        write_preprocessor_config(folder, card_mel_settings(card))
    found = hf_config(card)
    if found.note:
        notes.append(found.note)
    if found.config is None:
        return notes
    spec = spec_of(card)
    dtype = transformers_js_dtype(graphs, stored_as)
    half = set(HALF_DTYPES.values()) & set([dtype] if isinstance(dtype, str)
                                           else dtype.values())
    client = {"dtype": dtype}
    external = external_data_graphs(folder, graphs, stored_as)
    if external:  # transformers.js fetches NAME.onnx_data only when told
        client["use_external_data_format"] = external
    config = {**found.config, **spec.hf_config_extras,
              "torch_dtype": "float16" if half else "float32",  # the graphs' activations
              "transformers.js_config": client}
    _write_json(folder / CONFIG_JSON, config)
    if spec.generates:
        _write_json(folder / GENERATION_CONFIG,
                    {**generation_config(card), **speech_generation(folder, card)})
    for name, content in (modules_files(card) or {}).items():
        if name == SENTENCE_CONFIG and MODEL_GRAPH in stored_as:
            # sentence-transformers opens onnx/model.onnx unless told: its Transformer module
            # takes model_kwargs from this file (lowest priority), so a quantized export loads
            # as it is. Without it, SentenceTransformer(folder, backend="onnx") finds no
            # model.onnx and exports again from model.safetensors, whose zoo tensor names it
            # cannot read: random weights, with only a warning.
            content = {**content, "model_kwargs": {"file_name": stored_as[MODEL_GRAPH]}}
        _write_json(folder / name, content)
    return notes
