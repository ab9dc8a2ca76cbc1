"""`zoo export --adapters keep`: the base exported once with each adapted linear's LoRA factors
as graph inputs, the adapter in ONNX Runtime's adapter file; `zoo run --adapter NAME` and
`zoo.load(OUT).generate(..., GenerateOptions(adapter=NAME))` give the merged model's greedy
tokens, no adapter the base's; ONNX Runtime's own LoraAdapter gives the merged logits; bad
adapters, names and options are refused in one line. Per-row adapters in `zoo serve`:
tests/serve/test_serve_adapters.py."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest
import torch

from tests.support.greedy import torch_greedy
from tests.support.helpers import (
    assert_one_line_error,
    assert_refused_and_nothing_written,
    zoo,
    zoo_ok,
)
from tests.support.lora_folders import adapted_folder, merged_greedy

PROMPT = [5, 9, 14, 3, 27]
STEPS = 10
peft = pytest.importorskip("peft")  # zoo train --lora's extra: the adapter's layout


@pytest.fixture(scope="module")
def kept(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(the LoRA folder, its --adapters keep export), llama-tiny with r=3 on q, v, down."""
    root = tmp_path_factory.mktemp("kept")
    source = adapted_folder("llama-tiny", root / "tuned", seed=1, rank=3)
    zoo_ok("export", source, "--onnx", "--adapters", "keep", "-o", root / "out")
    return source, root / "out"


def test_the_export_keeps_the_base_and_writes_the_adapter_file(kept: tuple[Path, Path]) -> None:
    source, out = kept
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["adapters"]["files"] == {"tuned": "adapters/tuned.onnx_adapter"}
    inputs = manifest["graphs"]["onnx/model.onnx"]["inputs"]
    assert "layers.0.self_attention.query.lora_A" in inputs
    assert "layers.1.feed_forward.down.lora_B" in inputs
    assert inputs.index("position_ids") < inputs.index("layers.0.self_attention.query.lora_A") \
        < inputs.index("past_key_values.0.key")
    parameters = ort.AdapterFormat.read_adapter(
        str(out / "adapters/tuned.onnx_adapter")).get_parameters()
    assert len(parameters) == 2 * 3 * 2  # A and B, three targets, two layers
    assert parameters["layers.0.self_attention.query.lora_A"].numpy().shape == (1, 64, 3)


def test_run_with_the_adapter_gives_the_merged_tokens_and_without_it_the_base(
        kept: tuple[Path, Path]) -> None:
    source, out = kept
    ids = ",".join(map(str, PROMPT))
    merged = merged_greedy(source, PROMPT, STEPS)
    base = torch_greedy(source, PROMPT, STEPS)  # the base's weights alone
    assert merged != base  # the adapter changes the answer, or the test proves nothing
    adapted = zoo_ok("run", out, "--ids", ids, "--max-new-tokens", STEPS, "--adapter", "tuned")
    assert adapted.strip() == ",".join(map(str, merged))
    plain = zoo_ok("run", out, "--ids", ids, "--max-new-tokens", STEPS)
    assert plain.strip() == ",".join(map(str, base))


def test_zoo_parity_checks_the_graph_without_adapter_against_the_base_weights(
        kept: tuple[Path, Path]) -> None:
    """model.safetensors is the base's own (no LoRA factors: it loads as the card's model),
    which the graph computes when no adapter is fed."""
    assert "parity: PASSED" in zoo_ok("parity", kept[1])


def test_the_python_api_takes_the_adapter_in_its_options(kept: tuple[Path, Path]) -> None:
    import zoo as api

    source, out = kept
    exported = api.load(out)
    batch = [PROMPT, PROMPT[:3]]
    got = exported.generate(batch, api.GenerateOptions(max_new_tokens=STEPS, adapter="tuned"))
    assert [row.ids for row in got] == [merged_greedy(source, p, STEPS) for p in batch]
    base = exported.generate(batch, api.GenerateOptions(max_new_tokens=STEPS))
    assert [row.ids for row in base] == [torch_greedy(source, p, STEPS) for p in batch]


def test_onnx_runtimes_own_lora_adapter_gives_the_merged_logits(
        kept: tuple[Path, Path]) -> None:
    """The file as ONNX Runtime's clients use it: LoraAdapter.Load, then
    RunOptions.add_active_adapter; the graph needs no other feed for its factors."""
    from zoo.files.sources import load_folder

    source, out = kept
    session = ort.InferenceSession(str(out / "onnx/model.onnx"))
    options = ort.RunOptions()
    adapter = ort.LoraAdapter()
    adapter.Load(str(out / "adapters/tuned.onnx_adapter"))
    options.add_active_adapter(adapter)
    ids = np.array([PROMPT], np.int64)
    feeds = {"input_ids": ids, "attention_mask": np.ones_like(ids),
             "position_ids": np.arange(len(PROMPT))[None]}
    for layer in range(2):
        for kind in ("key", "value"):
            feeds[f"past_key_values.{layer}.{kind}"] = np.zeros((1, 2, 0, 16), np.float32)
    logits = session.run(["logits"], feeds, options)[0]
    model, _ = load_folder(source)  # the adapter merged into the weights
    with torch.no_grad():
        expected, _ = model(torch.tensor(ids), torch.ones(ids.shape, dtype=torch.long))
    np.testing.assert_allclose(logits, expected.numpy(), atol=1e-4, rtol=1e-4)


def test_an_adapter_the_export_lacks_is_refused_naming_the_known_ones(
        kept: tuple[Path, Path]) -> None:
    result = zoo("run", kept[1], "--ids", "5,6", "--adapter", "other")
    assert_one_line_error(result, "--adapter other", "not an adapter of this export",
                          "known: tuned")


def test_an_adapter_file_of_other_tensors_is_refused(kept: tuple[Path, Path],
                                                     tmp_path: Path) -> None:
    from registry.errors import ZooError
    from runtime.opening import open_export

    runtime = open_export(kept[1])
    good = ort.AdapterFormat.read_adapter(str(kept[1] / "adapters/tuned.onnx_adapter"))
    arrays = {name: value.numpy() for name, value in good.get_parameters().items()}
    renamed = dict(arrays)
    renamed["layers.9.mlp.lora_A"] = renamed.pop("layers.0.self_attention.query.lora_A")
    reshaped = dict(arrays)
    reshaped["layers.0.self_attention.query.lora_A"] = np.zeros((1, 32, 3), np.float32)
    ranks = dict(arrays)
    ranks["layers.0.self_attention.query.lora_B"] = np.zeros((1, 2, 64), np.float32)
    for case, tensors, expected in (("names", renamed, "unexpected ['layers.9.mlp.lora_A']"),
                                    ("shape", reshaped, "[1, 32, 3], expected float32 [1, 64"),
                                    ("rank", ranks, "has rank 3 but")):
        path = tmp_path / f"{case}.onnx_adapter"
        adapter = ort.AdapterFormat()
        adapter.set_parameters({n: ort.OrtValue.ortvalue_from_numpy(v)
                                for n, v in tensors.items()})
        adapter.export_adapter(str(path))
        with pytest.raises(ZooError, match=None) as refused:
            runtime.adapters.add(case, path)
        assert expected in str(refused.value) and "\n" not in str(refused.value)
        assert case not in runtime.adapters.names


@pytest.mark.parametrize(("extra", "message"), [
    (["--optimize"], "--adapters keep: not with --optimize"),
    (["--quantize", "int4"], "--adapters keep: not with --quantize int4"),
])
def test_keep_with_a_fused_or_quantized_graph_is_refused(kept: tuple[Path, Path],
                                                         tmp_path: Path, extra: list[str],
                                                         message: str) -> None:
    out = tmp_path / "out"
    result = zoo("export", kept[0], "--onnx", "--adapters", "keep", *extra, "-o", out)
    assert_one_line_error(result, message)
    assert not out.exists()


def test_keep_without_an_adapter_or_on_an_encoder_decoder_is_refused(tmp_path: Path) -> None:
    (tmp_path / "runs").mkdir()
    assert_refused_and_nothing_written(["export", "llama-tiny", "--onnx", "--adapters", "keep"],
                                       tmp_path / "runs" / "a", "no LoRA adapter in this folder")
    seq2seq = adapted_folder("t5-tiny", tmp_path / "t5", seed=2, rank=2,
                             targets=("query", "value"))
    assert_refused_and_nothing_written(["export", seq2seq, "--onnx", "--adapters", "keep"],
                                       tmp_path / "runs" / "b",
                                       "encoder-decoder exports are not supported")


def test_an_encoder_keeps_its_adapter_too(tmp_path: Path) -> None:
    """bert-tiny: the export's parity grid, fed the adapter file, held against the LoRA
    model; the pooled vector moves with the adapter and is the base's without it."""
    import zoo as api

    source = adapted_folder("bert-tiny", tmp_path / "tuned", seed=4, rank=2,
                            targets=("query", "value"))
    zoo_ok("export", source, "--onnx", "--adapters", "keep", "-o", tmp_path / "out")
    exported = api.load(tmp_path / "out")
    ids = [5, 9, 14, 3, 27]
    base, _ = exported.masked_predictions(ids)
    exported.use_adapter("tuned")
    adapted, _ = exported.masked_predictions(ids)
    assert base is not None and adapted is not None
    assert np.abs(adapted - base).max() > 1e-3
