"""sentence-transformers folders: `modules.json` lists a Transformer (the BERT-family body, a
Hugging Face folder), a Pooling module (`1_Pooling/config.json`) and maybe a Normalize. The body
is imported as usual; pooling and normalisation become the card fields `pooling` and
`normalize`. Modules the zoo has no head for (Dense, max pooling, ...) are refused by name.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from registry.errors import ZooError
from registry.families import spec_of
from registry.paths import display_path, inside
from runtime.files.json_files import read_json
from zoo.files.json_types import check_types

MODULES = "modules.json"
SENTENCE_CONFIG = "sentence_bert_config.json"
POOLING_CONFIG = "config.json"
# sentence-transformers' Pooling flags -> the card's pooling
POOLING_MODES = {"pooling_mode_cls_token": "cls", "pooling_mode_mean_tokens": "mean",
                 "pooling_mode_lasttoken": "last"}
UNSUPPORTED_MODES = ("pooling_mode_max_tokens", "pooling_mode_mean_sqrt_len_tokens",
                     "pooling_mode_weightedmean_tokens")


@dataclass
class SentenceModules:
    body: Path  # the Transformer module's folder
    fields: dict[str, Any]  # pooling, normalize
    record: dict[str, Any]  # for source.json


def _pooling(folder: Path) -> str:
    path = folder / POOLING_CONFIG
    where = display_path(path)
    config = read_json(path)
    if not isinstance(config, dict):
        raise ZooError(f"{where}: should be a JSON object")
    check_types(config, dict.fromkeys((*POOLING_MODES, *UNSUPPORTED_MODES), "bool"), where)
    odd = [key for key in UNSUPPORTED_MODES if config.get(key)]
    modes = [mode for key, mode in POOLING_MODES.items() if config.get(key)]
    if odd or len(modes) != 1:
        asked = ", ".join(odd + [k for k in POOLING_MODES if config.get(k)]) or "none"
        raise ZooError(f"{where}: pooling {asked}: the zoo imports exactly one of "
                       f"{', '.join(POOLING_MODES)}")
    return modes[0]


def _module_folder(folder: Path, path: object, where: str, index: int) -> Path:
    """A module's folder, inside the model's own ("" is the model folder itself, as
    sentence-transformers writes the Transformer's)."""
    if path in ("", "."):
        return folder
    return inside(folder, path, where, f"modules[{index}].path")


def read_modules(folder: Path) -> SentenceModules | None:
    """The folder's modules, or None when it is not a sentence-transformers folder."""
    path = Path(folder) / MODULES
    if not path.is_file():
        return None
    where = display_path(path)
    modules = read_json(path)
    if not isinstance(modules, list) or not all(isinstance(m, dict) for m in modules):
        raise ZooError(f"{where}: should be a list of modules")
    body, fields = None, {"normalize": False}
    for index, module in enumerate(modules):
        check_types(module, {"type": "str", "path": "str"}, where, f"modules[{index}].")
        kind = str(module.get("type", "")).rsplit(".", 1)[-1]
        place = _module_folder(Path(folder), module.get("path", ""), where, index)
        if kind == "Transformer" and body is None:
            body = place
        elif kind == "Pooling" and "pooling" not in fields:
            fields["pooling"] = _pooling(place)
        elif kind == "Normalize":
            fields["normalize"] = True
        else:
            raise ZooError(f"{where}: module {module.get('type')!r} ({module.get('path')}) has "
                           "no zoo counterpart (Transformer, Pooling, Normalize are imported)")
    if body is None or "pooling" not in fields:
        raise ZooError(f"{where}: expected a Transformer and a Pooling module")
    return SentenceModules(body, fields, {"modules": [m.get("type") for m in modules],
                                          **fields})


def modules_files(card: Any) -> dict[str, dict[str, Any] | list[dict[str, Any]]] | None:
    """The files that make a folder holding `card`'s body a sentence-transformers folder, read
    back by `read_modules` as the card's pooling and normalize ({path: JSON}); None where
    sentence-transformers has no module for the card's sentence vector (`pooler`, a dual
    encoder's) or none."""
    modes = {mode: key for key, mode in POOLING_MODES.items()}
    if card["pooling"] not in modes or card["num_labels"] or spec_of(card).joint_space:
        return None  # a dual encoder's text vector is its tower's projection, not a pooling
    pooling = {"word_embedding_dimension": card["d_model"],
               **{key: key == modes[card["pooling"]] for key in (*POOLING_MODES,
                                                                 *UNSUPPORTED_MODES)},
               "include_prompt": True}
    modules = [{"idx": 0, "name": "0", "path": "",
                "type": "sentence_transformers.models.Transformer"},
               {"idx": 1, "name": "1", "path": "1_Pooling",
                "type": "sentence_transformers.models.Pooling"}]
    if card["normalize"]:
        modules.append({"idx": 2, "name": "2", "path": "2_Normalize",
                        "type": "sentence_transformers.models.Normalize"})
    return {MODULES: modules, f"1_Pooling/{POOLING_CONFIG}": pooling,
            SENTENCE_CONFIG: {"max_seq_length": card["max_positions"], "do_lower_case": False}}
