"""Hand-made export folders for the tests that hand a command a hostile folder."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper

from registry.catalog import open_catalog
from runtime.contract import FORMAT_VERSION, MANIFEST
from runtime.files.atomic import sha256


def fake_export(folder: Path, location: str) -> Path:
    """A gpt-tiny 'export' (manifest with every sha256 right) whose model.onnx keeps one
    initializer in the external file `location`: what a hostile folder hands `zoo triton`."""
    (folder / "onnx").mkdir(parents=True)
    weight = helper.make_tensor("w", TensorProto.FLOAT, [4], np.ones(4, np.float32).tobytes(),
                                raw=True)
    weight.ClearField("raw_data")
    weight.data_location = TensorProto.EXTERNAL
    for key, value in (("location", location), ("offset", "0"), ("length", "16")):
        entry = weight.external_data.add()
        entry.key, entry.value = key, value
    graph = helper.make_graph([helper.make_node("Identity", ["w"], ["y"])], "g", [],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4])],
                              [weight])
    onnx.save(helper.make_model(graph), str(folder / "onnx/model.onnx"))
    card = open_catalog().get("gpt-tiny")
    manifest = {"format_version": FORMAT_VERSION, "name": card.name, "family": card.family,
                "card": card.fields,
                "graphs": {"onnx/model.onnx": {"inputs": [], "outputs": ["y"]}},
                "files": {"onnx/model.onnx": {"sha256": sha256(folder / "onnx/model.onnx")}}}
    (folder / MANIFEST).write_text(json.dumps(manifest), encoding="utf-8")
    return folder
