"""export/onnx/files.py: weights go to external data, shape arguments stay in the graph.

A mixture of 64 experts fuses its router and 128 projections into one MatMul whose Split
takes 129 widths (1,032 bytes): stored externally, onnx.checker's shape inference cannot read
them and the export failed. Checked on such a graph, written both ways the exports write
(graphs sharing weights.onnx.data, and a standalone graph too large for a protobuf)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import export.onnx.files as files

WIDTHS = np.full(129, 2, np.int64)  # 1,032 bytes: over the external-data threshold


def split_graph() -> tuple[onnx.ModelProto, np.ndarray]:
    """x (1, 8) @ W (8, 258), split into 129 pairs; the first and the last pair are outputs."""
    weight = np.random.default_rng(0).standard_normal((8, 258)).astype(np.float32)
    nodes = [helper.make_node("MatMul", ["x", "weight"], ["fused"]),
             helper.make_node("Split", ["fused", "widths"], [f"part{i}" for i in range(129)],
                              axis=1)]
    graph = helper.make_graph(
        nodes, "split", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8])],
        [helper.make_tensor_value_info(f"part{i}", TensorProto.FLOAT, [1, 2]) for i in (0, 128)],
        [numpy_helper.from_array(weight, "weight"), numpy_helper.from_array(WIDTHS, "widths")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=9)
    return model, weight


def assert_checks_and_runs(path: Path, weight: np.ndarray) -> None:
    onnx.checker.check_model(str(path), full_check=True)  # shape inference reads the widths
    proto = onnx.load(str(path), load_external_data=False)
    where = {t.name: t.data_location for t in proto.graph.initializer}
    assert where == {"weight": TensorProto.EXTERNAL, "widths": TensorProto.DEFAULT}
    x = np.random.default_rng(1).standard_normal((1, 8)).astype(np.float32)
    first, last = ort.InferenceSession(str(path)).run(["part0", "part128"], {"x": x})
    np.testing.assert_allclose(first, (x @ weight)[:, :2], atol=1e-5)
    np.testing.assert_allclose(last, (x @ weight)[:, -2:], atol=1e-5)


def test_graphs_sharing_weights_keep_their_split_widths_inline(tmp_path: Path) -> None:
    model, weight = split_graph()
    files.save_models({"onnx/a.onnx": model, "onnx/b.onnx": split_graph()[0]}, tmp_path)
    assert (tmp_path / "onnx" / files.SHARED_DATA).is_file()
    assert_checks_and_runs(tmp_path / "onnx" / "a.onnx", weight)


def test_a_graph_too_large_for_a_protobuf_keeps_its_split_widths_inline(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    model, weight = split_graph()
    monkeypatch.setattr(files, "PROTO_LIMIT", 1000)  # as if it were over 1.8 GB
    files.save_standalone({"onnx/model.onnx": model}, tmp_path)
    assert (tmp_path / "onnx" / "model.onnx_data").is_file()
    assert_checks_and_runs(tmp_path / "onnx" / "model.onnx", weight)


def test_a_lone_graph_too_large_keeps_its_weights_in_its_own_data_file(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """transformers.js fetches `model.onnx_data` for onnx/model.onnx (use_external_data_format),
    not a file shared with other graphs."""
    model, weight = split_graph()
    monkeypatch.setattr(files, "PROTO_LIMIT", 1000)  # as if it were over 1.8 GB
    files.save_models({"onnx/model.onnx": model}, tmp_path)
    assert sorted(p.name for p in (tmp_path / "onnx").iterdir()) == ["model.onnx",
                                                                      "model.onnx_data"]
    assert_checks_and_runs(tmp_path / "onnx" / "model.onnx", weight)


def test_a_proto_protobuf_cannot_count_is_too_large() -> None:
    """Past 2 GB, ByteSize raises instead of counting (gemma-3-1b's 4 GB trace did): such a
    graph is too large, not a traceback."""
    from google.protobuf.message import EncodeError

    class Past2GB:
        def ByteSize(self) -> int:  # noqa: N802 - protobuf's name
            raise EncodeError("Failed to serialize proto")

    assert files.too_large(Past2GB())
    assert not files.too_large(split_graph()[0])
