"""Shared fixtures: the shipped cards, by name, exports made once per session, and small
helpers for random inputs."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import onnx
import pytest
import torch
from safetensors import safe_open

from registry import Card, open_catalog

CATALOG = open_catalog()
ALL_CARDS = CATALOG.names()
TINY_CARDS = CATALOG.names("*-tiny")
FULL_CARDS = [name for name in ALL_CARDS if name not in TINY_CARDS]


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Under `make test` (pytest-xdist, --dist loadgroup) each test file runs in one worker, so
    its module fixtures are made once, and the files marked `xdist_group("shared-exports")`
    share one worker, so the session's exports are made once. pytest-xdist groups by a suffix
    on the node id, which pytest 9.2 no longer lets it set (pytest-xdist#1386): set it here.
    """
    from _pytest.nodeid import coerce_node_id

    if not getattr(config.option, "loadgroup", False):
        return
    for item in items:
        if "@" in item.nodeid.rpartition("]")[2]:
            continue  # a pytest on which xdist's own suffix works
        mark = item.get_closest_marker("xdist_group")
        group = mark.args[0] if mark else item.nodeid.split("::")[0]
        item._id = coerce_node_id(f"{item.nodeid}@{group}")


def pytest_configure(config: pytest.Config) -> None:
    """ZOO_EXPORT_LOG=FILE: append one line per torch.onnx.export (seconds, test) to FILE. A
    tiny card's trace takes seconds (torch.export's symbolic shapes) and dominates the suite's
    time, so this is how to see which tests pay for exports."""
    import os

    log = os.environ.get("ZOO_EXPORT_LOG")
    if not log:
        return
    import time

    import torch.onnx

    traced = torch.onnx.export

    def logged(*args: Any, **kwargs: Any) -> Any:
        start = time.perf_counter()
        try:
            return traced(*args, **kwargs)
        finally:
            test = os.environ.get("PYTEST_CURRENT_TEST", "?").rsplit(" ", 1)[0]
            with open(log, "a", encoding="utf-8") as file:
                file.write(f"{time.perf_counter() - start:.1f}\t{test}\n")

    torch.onnx.export = logged


def card(name: str, **overrides: object) -> Card:
    return CATALOG.get(name, overrides or None)


def random_ids(card: Card, batch: int, length: int, seed: int = 0) -> torch.Tensor:
    """Ids that avoid the special tokens below 3 and the pad token."""
    generator = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, card["vocab_size"], (batch, length), generator=generator)
    return ids.masked_fill(ids == card["pad_token_id"], 3)


@pytest.fixture(params=TINY_CARDS)
def tiny_card(request: pytest.FixtureRequest) -> Card:
    return card(request.param)


VARIANTS: dict[str, dict[str, Any]] = {
    "plain": {}, "optimize": {"optimize": True}, "int8": {"quantize": "int8"},
    "int4": {"quantize": "int4"}, "attentions": {"attentions": True},
}
SharedExport = Callable[..., tuple[Path, Any]]


@pytest.fixture(scope="session")
def shared_export(tmp_path_factory: pytest.TempPathFactory) -> SharedExport:
    """`shared_export(name, variant="plain")` -> (folder, report): a tiny card built with seed 1
    and exported (with its check) once per session, on first use, for every test that only
    reads it. A test that alters an export copies it first."""
    from export.pipeline import export_and_verify
    from zoo.build import build_model

    root = tmp_path_factory.mktemp("shared-exports")
    made: dict[tuple[str, str], tuple[Path, Any]] = {}

    def get(name: str, variant: str = "plain") -> tuple[Path, Any]:
        if (name, variant) not in made:
            folder = root / f"{name}-{variant}"
            report = export_and_verify(build_model(card(name), seed=1), card(name), folder,
                                       **VARIANTS[variant])
            made[name, variant] = folder, report
        return made[name, variant]

    return get


def count_module_parameters(model: torch.nn.Module) -> int:
    return sum(parameter.numel() for parameter in model.parameters())


def prompt_feeds(card: Card, ids: list[int]) -> dict:
    """Feeds for a decoder's model.onnx: the whole prompt, unpadded, with an empty cache."""
    import numpy as np

    source = np.array([ids], np.int64)
    heads = card["n_heads"]
    empty = np.zeros((1, heads, 0, card["d_model"] // heads), np.float32)
    return {"input_ids": source, "attention_mask": np.ones_like(source),
            "position_ids": np.arange(len(ids))[None],
            **{f"past_key_values.{i}.{kv}": empty for i in range(card["n_layers"])
               for kv in ("key", "value")}}


def modules_loaded(calls: list[list[str]], roots: tuple[str, ...]) -> list[str]:
    """The modules under `roots` that running the CLI with each argument list loads, in a
    fresh interpreter (so nothing a test imported here counts)."""
    import json
    import os
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    script = (f"import json, sys\nfrom cli import main\nfor args in {calls!r}:\n"
              "    try:\n        main(args, standalone_mode=False)\n"
              "    except SystemExit:\n        pass\n"
              f"print(json.dumps(sorted(m for m in sys.modules "
              f"if m.split('.')[0] in {roots!r})))\n")
    env = {**os.environ, "PYTHONPATH": str(root)}
    env.pop("ZOO_PATH", None)
    done = subprocess.run([sys.executable, "-c", script], cwd=root, env=env,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.splitlines()[-1])


def tensor_payload_bytes(tensor: onnx.TensorProto) -> int:
    """Bytes a tensor keeps inside the .onnx file (external ones live in the .data file)."""
    if tensor.data_location == onnx.TensorProto.EXTERNAL:
        return 0
    return (len(tensor.raw_data) + 4 * len(tensor.float_data) + 8 * len(tensor.int64_data)
            + 4 * len(tensor.int32_data))


def _onnx_tensors(folder: Path) -> Iterator[tuple[str, onnx.TensorProto]]:
    """(file, tensor) for every initializer and Constant value of every .onnx in `folder`."""
    for path in sorted(folder.glob("*.onnx")):
        model = onnx.load(str(path), load_external_data=False)
        yield from ((path.name, tensor) for tensor in model.graph.initializer)
        yield from ((path.name, a.t) for node in model.graph.node for a in node.attribute
                    if a.type == onnx.AttributeProto.TENSOR)


def _external_range(tensor: onnx.TensorProto) -> tuple[str, int, int]:
    info = {entry.key: entry.value for entry in tensor.external_data}
    return info["location"], int(info.get("offset", 0)), int(info["length"])


def stored_tensor_bytes(folder: Path) -> int:
    """Every tensor byte the ONNX files of an export hold: inline initializers and Constant
    values in each .onnx, plus each distinct range of the external data files (without the
    alignment padding between them)."""
    inline, ranges = 0, set()
    for _, tensor in _onnx_tensors(folder):
        if tensor.data_location == onnx.TensorProto.EXTERNAL:
            ranges.add(_external_range(tensor))
        else:
            inline += tensor_payload_bytes(tensor)
    return inline + sum(length for _, _, length in ranges)


def weight_copies(folder: Path) -> dict[str, tuple[int, int]]:
    """{weight name: (copies the ONNX files store, copies safetensors holds)}, matched by
    content: an external range shared by several graphs counts once. Weights with equal
    content (norms at init) share one count, so each is compared as a multiset."""
    import hashlib

    from onnx import numpy_helper

    def digest(data: bytes) -> str:
        return hashlib.sha256(data).hexdigest()

    stored: Counter[str] = Counter()
    ranges: set[tuple[str, int, int]] = set()
    for _, tensor in _onnx_tensors(folder):
        if tensor.data_location == onnx.TensorProto.EXTERNAL:
            where = _external_range(tensor)
            if where not in ranges:
                ranges.add(where)
                with (folder / where[0]).open("rb") as data:
                    data.seek(where[1])
                    stored[digest(data.read(where[2]))] += 1
        else:
            stored[digest(numpy_helper.to_array(tensor).tobytes())] += 1
    with safe_open(str(folder / "model.safetensors"), "np") as weights:
        digests = {key: digest(weights.get_tensor(key).tobytes()) for key in weights.keys()}  # noqa: SIM118
    held = Counter(digests.values())
    return {key: (stored[d], held[d]) for key, d in digests.items()}


def weight_bytes(folder: Path) -> int:
    """The tensor payload of the reference safetensors (what each weight costs once)."""
    with safe_open(str(folder / "model.safetensors"), "np") as weights:
        return sum(weights.get_tensor(key).nbytes for key in weights.keys())  # noqa: SIM118


def assert_weights_stored_once(folder: Path, buffers: int = 0) -> None:
    """No weight stored twice across the ONNX files of an export (inline in two graphs, or
    inline and external): matched by content, and bounded in bytes, where the slack (4 KB:
    shapes, masks' fill values, folded constants) is half the smallest table of a tiny card.
    `buffers`: bytes of tensors computed from the card (the sinusoid table), not in safetensors.
    """
    copies = weight_copies(folder)
    twice = sorted(name for name, (stored, held) in copies.items() if stored > held)
    assert not twice, f"stored more than once: {twice}"
    assert stored_tensor_bytes(folder) - buffers <= weight_bytes(folder) + 4096
