"""LoRA as an option on any built model (zoo/blocks/lora.py) against PEFT's own layers, and
`zoo train --lora` on a card: only the adapters train, OUT keeps the base's weights and the
adapter apart, an export of OUT merges it, and bad ranks and targets are refused in one line
with nothing written. PEFT interop on an imported Llama: tests/imports/test_lora_peft.py."""

from __future__ import annotations

import copy
import json
import math
from pathlib import Path

import pytest
import torch
from torch import nn

from tests.conftest import card
from tests.support.helpers import assert_one_line_error, zoo, zoo_ok
from zoo.assemble import build_model
from zoo.blocks.lora import LoRALinear, add_adapters, merge_adapters
from zoo.files.peft_adapter import ADAPTER_CONFIG, ADAPTER_WEIGHTS
from zoo.files.sources import load_source
from zoo.files.weights import WEIGHTS, read_tensors
from zoo.training.checkpoints import latest_checkpoint

peft = pytest.importorskip("peft")


class Block(nn.Module):
    """Linears named as the zoo names them, with and without bias, of different shapes."""

    def __init__(self) -> None:
        super().__init__()
        self.query = nn.Linear(12, 12)
        self.value = nn.Linear(12, 8, bias=False)
        self.up = nn.Linear(12, 20)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.up(x).sum(-1, keepdim=True) + self.query(x).sum(-1, keepdim=True) \
            + self.value(x).sum(-1, keepdim=True)


def _pair(rslora: bool, dropout: float = 0.0) -> tuple[nn.Module, nn.Module]:
    """(the zoo's adapters, PEFT's) on the same random Block, A and B set alike, B non-zero."""
    torch.manual_seed(0)
    base = Block()
    ours, theirs = copy.deepcopy(base), copy.deepcopy(base)
    torch.manual_seed(1)
    add_adapters(ours, ["query", "value"], 4, 6.0, dropout, rslora)
    torch.manual_seed(1)
    config = peft.LoraConfig(r=4, lora_alpha=6, target_modules=["query", "value"],
                             lora_dropout=dropout, use_rslora=rslora)
    theirs = peft.get_peft_model(theirs, config)
    generator = torch.Generator().manual_seed(2)
    with torch.no_grad():
        for name in ("query", "value"):
            mine = getattr(ours, name)
            layer = getattr(theirs.base_model.model, name)
            assert torch.equal(mine.lora_A.weight, layer.lora_A["default"].weight)  # PEFT's init
            assert not mine.lora_B.weight.any()
            b = torch.randn(mine.lora_B.weight.shape, generator=generator)
            mine.lora_B.weight.copy_(b)
            layer.lora_B["default"].weight.copy_(b)
    return ours, theirs


@pytest.mark.parametrize("rslora", [False, True], ids=["alpha-over-r", "rslora"])
def test_adapters_compute_and_merge_as_peft(rslora: bool) -> None:
    ours, theirs = _pair(rslora)
    assert isinstance(ours.query, LoRALinear) and type(ours.up) is nn.Linear
    assert ours.query.scaling == (6 / math.sqrt(4) if rslora else 6 / 4)
    x = torch.randn(3, 5, 12, generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        reference = theirs(x)
        with theirs.disable_adapter():
            assert (reference - theirs(x)).abs().max() > 0.1  # B moves it
        torch.testing.assert_close(ours(x), reference, atol=1e-5, rtol=0)
        merged = merge_adapters(ours)
        assert all(type(m) is nn.Linear for m in (merged.query, merged.value))
        torch.testing.assert_close(merged(x), theirs.merge_and_unload()(x), atol=1e-5, rtol=0)


def test_only_the_adapters_train_and_dropout_is_on_their_input() -> None:
    ours, theirs = _pair(False, dropout=0.5)
    trainable = [name for name, p in ours.named_parameters() if p.requires_grad]
    assert sorted(trainable) == sorted(f"{m}.lora_{p}.weight" for m in ("query", "value")
                                       for p in "AB")
    assert sorted(ours.state_dict()) == sorted(  # the base's tensor names are unchanged
        [*Block().state_dict(), *(f"{m}.lora_{p}.weight" for m in ("query", "value")
                                  for p in "AB")])
    x = torch.randn(4, 12, generator=torch.Generator().manual_seed(4))
    ours.train()
    theirs.train()
    torch.manual_seed(5)
    a = ours.query(x)
    torch.manual_seed(5)
    b = theirs.base_model.model.query(x)
    torch.testing.assert_close(a, b, atol=1e-5, rtol=0)  # the same mask, on A's input


def _train(source: str | Path, out: Path, *extra: str) -> str:
    return zoo_ok("train", source, "--task", "lm", "--steps", "4", "--batch-size", "2",
                  "--block-size", "16", "--checkpoint-every", "2", "--lr", "1e-2",
                  "--warmup", "1", "-o", out, *extra)


def test_train_lora_on_a_card_keeps_the_base_and_the_adapter_apart(tmp_path: Path) -> None:
    out = tmp_path / "out"
    printed = _train("llama-tiny", out, "--lora", "2", "--lora-targets", "query,out,down")
    base = build_model(card("llama-tiny"), seed=0)  # what `zoo train llama-tiny` starts from
    kept = read_tensors(out / WEIGHTS)
    assert sorted(kept) == sorted(base.state_dict())
    for name, tensor in base.state_dict().items():
        assert torch.equal(kept[name], tensor), name  # the base did not move
    config = json.loads((out / ADAPTER_CONFIG).read_text())
    assert (config["peft_type"], config["r"], config["lora_alpha"]) == ("LORA", 2, 8.0)
    adapter = read_tensors(out / ADAPTER_WEIGHTS)
    layers = range(card("llama-tiny")["n_layers"])
    # llama-tiny is a card Llama's map writes: PEFT's names are LlamaForCausalLM's
    hf = {"self_attention.query": "self_attn.q_proj", "self_attention.out": "self_attn.o_proj",
          "feed_forward.down": "mlp.down_proj"}
    assert sorted(adapter) == sorted(f"base_model.model.model.layers.{i}.{name}.lora_{p}.weight"
                                     for i in layers for name in hf.values() for p in "AB")
    assert config["target_modules"] == ["down_proj", "o_proj", "q_proj"]
    lora_b = [t for name, t in adapter.items() if ".lora_B." in name]
    assert all(t.abs().max() > 0 for t in lora_b)  # trained: B left zero
    count = sum(t.numel() for t in adapter.values())
    total = sum(p.numel() for p in base.parameters())
    assert f"training {count:,} parameters" in printed and f"base's {total:,}" in printed
    optimizer = read_tensors(next((out / "checkpoints").glob("step-*")) /
                             "optimizer.safetensors")
    assert {key.rpartition("/")[0] for key in optimizer} == {  # the adapters' state only
        f"layers.{i}.{name}.lora_{p}.weight" for i in layers for name in hf for p in "AB"}
    # the folder loads merged: W + (alpha / r) B A, by torch arithmetic on the files
    merged, _ = load_source(str(out))
    prefix = "base_model.model.model.layers.0.self_attn.o_proj"
    weight = "layers.0.self_attention.out.weight"
    expected = kept[weight] + 8.0 / 2 * (adapter[f"{prefix}.lora_B.weight"]
                                         @ adapter[f"{prefix}.lora_A.weight"])
    torch.testing.assert_close(merged.state_dict()[weight], expected, atol=1e-6, rtol=0)


def test_export_of_a_lora_folder_merges_and_passes_parity(tmp_path: Path) -> None:
    out = tmp_path / "out"
    _train("llama-tiny", out, "--lora", "2", "--rslora")
    zoo_ok("export", out, "--onnx", "-o", tmp_path / "onnx")  # its parity grid passed
    # the reference weights the export carries (and its graphs were proved against) are the
    # base's with W + (alpha / sqrt r) B A, computed here from OUT's files
    carried = read_tensors(tmp_path / "onnx" / WEIGHTS)
    base, adapter = read_tensors(out / WEIGHTS), read_tensors(out / ADAPTER_WEIGHTS)
    prefix = "base_model.model.model.layers.1.self_attn.v_proj"
    weight = "layers.1.self_attention.value.weight"
    delta = 8.0 / math.sqrt(2) * (adapter[f"{prefix}.lora_B.weight"]
                                  @ adapter[f"{prefix}.lora_A.weight"])
    assert delta.abs().max() > 1e-3
    torch.testing.assert_close(carried[weight], base[weight] + delta, atol=1e-6, rtol=0)
    assert not any(".lora_" in name for name in carried)


@pytest.mark.parametrize("args, parts", [
    (["--lora", "0"], ["llama-tiny: --lora 0: the rank should be >= 1"]),
    (["--lora", "65"], ["llama-tiny: --lora 65: larger than", "at most 64"]),
    (["--lora", "2", "--lora-targets", "query,qkv"],
     ["llama-tiny: --lora-targets qkv: not a linear's name in the zoo"]),
], ids=["rank-0", "rank-over-layer", "unknown-target"])
def test_bad_lora_input_is_one_line_and_writes_nothing(tmp_path: Path, args: list[str],
                                                       parts: list[str]) -> None:
    out = tmp_path / "out"
    result = zoo("train", "llama-tiny", "--task", "lm", "--steps", "1", "-o", out, *args)
    assert_one_line_error(result, *parts)
    assert list(tmp_path.iterdir()) == []


def test_a_target_no_linear_of_the_model_has_is_refused(tmp_path: Path) -> None:
    """gpt-tiny's feed-forward is up, activation, down: no gate."""
    result = zoo("train", "gpt-tiny", "--task", "lm", "--steps", "1", "-o", tmp_path / "out",
                 "--lora", "2", "--lora-targets", "gate")
    assert_one_line_error(result, "gpt-tiny: --lora-targets gate: matches no linear",
                          "it has: query, key, value, out, up, down")
    assert list(tmp_path.iterdir()) == []


# every family and stack: self- and cross-attention (transformer-tiny's decoder scales its cross
# queries inside the projection), T5's relative bias, a mixture (its experts left out)
@pytest.mark.parametrize("name, task", [
    ("gpt-tiny", "lm"), ("gemma-tiny", "lm"), ("moe-tiny", "lm"), ("bert-tiny", "mlm"),
    ("transformer-tiny", "copy"), ("t5-tiny", "copy")])
def test_every_family_computes_its_adapters_as_the_merged_weights(tmp_path: Path, name: str,
                                                                 task: str) -> None:
    """The adapted model's logits equal a fresh base's with W + s B A loaded, computed here."""
    from zoo.training.tasks import Task, TrainOptions

    tiny = card(name)
    model = build_model(tiny, seed=0)
    reference = build_model(tiny, seed=0)
    present = {n.rpartition(".")[2] for n, m in model.named_modules()
               if type(m) is nn.Linear and "experts" not in n}
    names = add_adapters(model, sorted(present & {"query", "key", "value", "out", "gate", "up",
                                                  "down"}), 3, 5.0)
    assert names and not any("experts" in n for n in names)
    state = reference.state_dict()
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for module_name in names:
            layer = model.get_submodule(module_name)
            layer.lora_B.weight.copy_(0.2 * torch.randn(layer.lora_B.weight.shape,
                                                        generator=generator))
            state[f"{module_name}.weight"] += 5.0 / 3 * (layer.lora_B.weight
                                                          @ layer.lora_A.weight)
    reference.load_state_dict(state)
    options = TrainOptions(task=task, out=tmp_path, batch_size=2, block_size=12)
    run = Task(tiny, options.resolved(tiny))
    batch = run.batch(0, 0)
    model.eval()
    with torch.no_grad():
        ours, theirs = run.logits(model, batch), run.logits(reference, batch)
        plain = run.logits(build_model(tiny, seed=0).eval(), batch)
    assert (theirs - plain).abs().max() > 1e-2
    torch.testing.assert_close(ours, theirs, atol=1e-4, rtol=0)
    torch.testing.assert_close(run.logits(merge_adapters(model), batch), theirs, atol=1e-4,
                               rtol=0)


class Interrupt(Exception):
    pass


def test_a_lora_run_resumed_equals_an_uninterrupted_one(tmp_path: Path) -> None:
    """The adapters' optimizer state is restored by name: the same losses, the same adapter."""
    from zoo.commands import train_command
    from zoo.training.tasks import TrainOptions

    def run(out: Path, **extra: object) -> None:
        options = TrainOptions(task="lm", out=out, steps=6, batch_size=2, block_size=16,
                               checkpoint_every=3, lr=1e-2, warmup=1, lora=2, seed=1,
                               lora_targets="query,value,up", lora_dropout=0.1, **extra)
        train_command("llama-tiny", options, progress=stop)

    def stop(step: int, *rest: float) -> None:
        if step == 6 and stopping:  # logged before its checkpoint: resumed from step 3
            raise Interrupt

    stopping = False
    run(tmp_path / "whole")
    stopping = True
    with pytest.raises(Interrupt):
        run(tmp_path / "cut")
    assert latest_checkpoint(tmp_path / "cut").step == 3
    stopping = False
    run(tmp_path / "cut", resume=True)
    for name in (ADAPTER_WEIGHTS, WEIGHTS):
        a, b = read_tensors(tmp_path / "whole" / name), read_tensors(tmp_path / "cut" / name)
        assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a), name
