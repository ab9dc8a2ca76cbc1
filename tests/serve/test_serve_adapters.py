"""`zoo serve BASE --adapter NAME=FILE`: LoRA adapters of an `--adapters keep` export served
as models BASE:NAME; requests for different adapters (and none) decode in one batch, each row
with its own factors, and get the greedy tokens of that adapter merged into the weights
(PyTorch); the prefix cache never serves a prefix cached under one adapter to another; a bad
--adapter is one line before anything is served."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest

from runtime.opening import open_export
from runtime.sampling import Sampling
from runtime.serve.prefix_cache import PrefixCache
from runtime.serve.scheduler import Job, Scheduler
from tests.conftest import card
from tests.support.greedy import torch_greedy, until_eos
from tests.support.helpers import assert_one_line_error, zoo, zoo_ok
from tests.support.lora_folders import adapted_folder, merged_greedy
from tests.support.serve import Collected, Server

peft = pytest.importorskip("peft")  # zoo train --lora's extra: the adapter's layout
STEPS = 8


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """llama-tiny's base exported once keeping adapter x (r=2); adapter y (r=4, same
    linears) written as the export writes its own, from another LoRA folder."""
    from export.onnx.kept_adapters import adapter_parameters, write_adapter_file
    from zoo.files.sources import load_folder

    root = tmp_path_factory.mktemp("adapters")
    x = adapted_folder("llama-tiny", root / "x", seed=2, rank=2)
    y = adapted_folder("llama-tiny", root / "y", seed=3, rank=4)
    zoo_ok("export", x, "--onnx", "--adapters", "keep", "-o", root / "out")
    write_adapter_file(adapter_parameters(load_folder(y, merge=False)[0]),
                       root / "y.onnx_adapter")
    return {"x": x, "y": y, "out": root / "out", "y_file": root / "y.onnx_adapter"}


def expected(served: dict[str, Path], adapter: str | None, prompt: list[int]) -> list[int]:
    """The tokens of that adapter merged into the weights (the base's own: None)."""
    source = served["x"] if adapter is None else served[adapter]
    tokens = torch_greedy(source, prompt, STEPS) if adapter is None \
        else merged_greedy(source, prompt, STEPS)
    return until_eos(tokens, card("llama-tiny")["eos_token_id"])


def batched(scheduler: Scheduler, requests: list[tuple[list[int], str | None]]
            ) -> list[list[int]]:
    sinks = [Collected() for _ in requests]
    with scheduler.wake:  # its thread takes none of them until all are queued
        for (prompt, adapter), sink in zip(requests, sinks, strict=True):
            scheduler.submit(Job(prompt, STEPS, Sampling(), (), False, sink, adapter=adapter))
    for sink in sinks:
        assert sink.finished.wait(120), "a request never finished"
    return [next(value.ids for name, value in sink.events if name == "done") for sink in sinks]


def test_rows_of_different_adapters_in_one_batch_get_their_merged_tokens(
        served: dict[str, Path]) -> None:
    runtime = open_export(served["out"])
    runtime.adapters.add("y", served["y_file"])
    rng = np.random.default_rng(5)
    adapters = ["x", "y", None, "y", "x", None, "x"]
    requests = [(rng.integers(3, 250, int(n)).tolist(), adapter)
                for n, adapter in zip(rng.integers(2, 12, len(adapters)), adapters,
                                      strict=True)]
    wanted = [expected(served, adapter, prompt) for prompt, adapter in requests]
    assert wanted[0] != expected(served, None, requests[0][0])  # x changes the answer
    scheduler = Scheduler(runtime, 4, lambda ids: "", "test")  # rows join and leave
    assert batched(scheduler, requests) == wanted
    assert scheduler.largest == 4  # they did share batches


def test_a_prefix_cached_under_one_adapter_is_not_served_to_another(
        served: dict[str, Path]) -> None:
    runtime = open_export(served["out"])
    runtime.adapters.add("y", served["y_file"])
    prompt = list(range(10, 50))  # two whole blocks of 16 cached
    scheduler = Scheduler(runtime, 4, lambda ids: "", "test",
                          prefix_cache=PrefixCache(1 << 24))
    for adapter in ("x", "y", None, "x"):
        assert batched(scheduler, [(prompt, adapter)]) == [expected(served, adapter, prompt)]
    hit, missed, _, _ = scheduler.prefix.stats()
    assert hit == 32  # the last request, under x again, did start from x's cached blocks


def test_the_adapters_are_models_and_an_unknown_one_is_404(served: dict[str, Path],
                                                           tmp_path: Path) -> None:
    server = Server([served["out"]], tmp_path / "log", "--adapter",
                    f"y={served['y_file']}")
    try:
        status, listing = server.get("/v1/models")
        assert status == 200
        assert sorted(model["id"] for model in listing["data"]) == ["out", "out:x", "out:y"]
        prompt = [7, 19, 33, 4]
        for model, adapter in (("out:y", "y"), ("out", None)):
            status, body = server.request("/v1/completions", {
                "model": model, "prompt": prompt, "max_tokens": STEPS, "temperature": 0})
            assert status == 200, body
            assert body["usage"]["completion_tokens"] == len(expected(served, adapter, prompt))
        status, body = server.request("/v1/completions", {"model": "out:z", "prompt": [5]})
        assert status == 404 and body["error"]["code"] == "model_not_found"
    finally:
        server.stop()


def _adapter_file(path: Path, tensors: dict[str, np.ndarray]) -> Path:
    adapter = ort.AdapterFormat()
    adapter.set_parameters({name: ort.OrtValue.ortvalue_from_numpy(value)
                            for name, value in tensors.items()})
    adapter.export_adapter(str(path))
    return path


def test_a_bad_adapter_spec_is_one_line_before_serving(served: dict[str, Path],
                                                       tmp_path: Path) -> None:
    good = ort.AdapterFormat.read_adapter(str(served["y_file"])).get_parameters()
    other_base = {name: np.zeros((1, 32, 2) if name.endswith("lora_A") else (1, 2, 64),
                                 np.float32) for name in good}  # d_model 32: another base
    cases = [
        ("y", "expected NAME=FILE"),
        (f"y={tmp_path / 'none.onnx_adapter'}", "no such adapter file"),
        (f"y={_adapter_file(tmp_path / 'other.onnx_adapter', other_base)}",
         "expected float32 [1, 64, 'r']"),
        (f"x={served['y_file']}", "the name x is already taken"),
    ]
    for spec, message in cases:
        assert_one_line_error(zoo("serve", served["out"], "--adapter", spec), message)
