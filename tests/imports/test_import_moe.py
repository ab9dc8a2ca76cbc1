"""`zoo import` of a mixture-of-experts folder whose experts are stored fused, as transformers 5
holds them in memory: refused in one line naming the file and the tensors.

Not a row of tests/support/hf_decoders.py's DECODERS (tests/imports/test_hf_decoders.py checks
the Qwen3-MoE, OLMoE and Mixtral imports): a change to the weights file, not to config.json.

`transformers` is a test-only dependency: it makes the reference model here."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from tests.support.hf_decoders import DECODERS, assert_import_refused, changed_source, saved

pytest.importorskip("transformers")


def _fused(folder: Path) -> None:
    """The experts as transformers 5 holds them in memory (one 3-D gate_up_proj, down_proj)."""
    path = folder / "model.safetensors"
    tensors = load_file(path)
    for layer in (1, 2):
        prefix = f"model.layers.{layer}.mlp.experts"
        names = [f"{prefix}.{e}.{part}_proj.weight" for e in range(4)
                 for part in ("gate", "up", "down")]
        gate_up = torch.stack([torch.cat([tensors[f"{prefix}.{e}.gate_proj.weight"],
                                          tensors[f"{prefix}.{e}.up_proj.weight"]])
                               for e in range(4)])
        down = torch.stack([tensors[f"{prefix}.{e}.down_proj.weight"] for e in range(4)])
        for key in names:
            del tensors[key]
        tensors[f"{prefix}.gate_up_proj"], tensors[f"{prefix}.down_proj"] = gate_up, down
    save_file(tensors, path)


def test_fused_experts_are_refused_by_name(tmp_path: Path,
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    source, _ = saved(DECODERS["qwen3_moe"], tmp_path / "hf")
    _fused(changed_source(source, {}, tmp_path))
    assert_import_refused(tmp_path, "src/model.safetensors",
                          "missing: layers.1.mlp.experts.0.down_proj.weight",
                          "unexpected: model.layers.1.mlp.experts.down_proj")
