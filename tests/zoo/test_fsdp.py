"""`zoo train --shard full` (FSDP2 under torchrun, gloo on CPU): the ranks' losses equal one
process that averages the same ranks' gradients, each rank holds about half of Adam's state,
a sharded checkpoint resumes on 1 or 2 ranks to the losses of an uninterrupted run, the result
exports with parity, and bad input is one line.

The reference is a plain loop here (torch.optim.Adam on the unsharded model): each step it
runs every rank's batch (the zoo's batches are a function of seed, step and rank), averages
their gradients (what FSDP's reduce-scatter and DDP's all-reduce do), clips and steps; the
loss a run records is rank 0's."""

from __future__ import annotations

import functools
import json
import os
import shutil
import socket
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner
from safetensors.torch import load_file

from cli import main
from tests.conftest import card
from zoo.assemble import build_model
from zoo.blocks.lora import add_adapters
from zoo.training import sharding
from zoo.training.data import batch_generator
from zoo.training.schedules import make_scheduler
from zoo.training.tasks import Task, TrainOptions

REPO = Path(__file__).resolve().parents[2]
STEPS, EVERY = 12, 6
ARGS = ["--batch-size", "4", "--block-size", "32", "--seed", "3"]
# float32 sums in another order, and trainer.json's losses rounded to 6 decimals (measured:
# at most 1.1e-6 over 12 and 50 steps of llama-tiny, 9.0e-7 over 50 of gemma-tiny)
LOSS_TOLERANCE = 1e-5


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def torchrun(ranks: int, args: list[str], cwd: Path, timeout: int = 240,
             launcher: list[str] | None = None) -> subprocess.CompletedProcess:
    """`zoo train` under torchrun: ranks on 127.0.0.1, a free port, bounded time."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "GLOO_SOCKET_IFNAME": "lo"}
    launcher = launcher or ["--nnodes", "1", "--master-addr", "127.0.0.1",
                            "--master-port", str(free_port())]
    command = [sys.executable, "-m", "torch.distributed.run", *launcher,
               "--nproc_per_node", str(ranks), str(REPO / "cli.py"), "train", *args]
    return subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=timeout)


def train_sharded(ranks: int, name: str, out: Path, steps: int = STEPS,
                  extra: tuple[str, ...] = (), task: str = "lm") -> dict:
    result = torchrun(ranks, [name, "--task", task, *ARGS, "--steps", str(steps),
                              "--checkpoint-every",
                              str(EVERY), "--shard", "full", "-o", str(out), *extra], out.parent)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.count(f"trained {name}") == 1  # only rank 0 reports
    return json.loads((out / "checkpoints" / f"step-{steps:08d}" / "trainer.json").read_text())


@functools.cache
def reference(name: str, worlds: tuple[int, ...], lora: int | None = None, task: str = "lm"
              ) -> tuple[list[float], torch.nn.Module]:
    """Rank 0's losses of a run whose step i averages the gradients of worlds[i] ranks (with
    `lora`, rank-`lora` adapters on query and value, made as `zoo train` makes them)."""
    tiny = card(name)
    opts = TrainOptions(task=task, out=Path("unused"), steps=len(worlds), batch_size=4,
                        block_size=32, seed=3).resolved(tiny)
    model = build_model(tiny, seed=opts.seed)
    if lora is not None:
        add_adapters(model, ["query", "value"], lora, 8.0, 0.0, False, where=name)
    model.train()
    run = Task(tiny, opts)
    trained = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.Adam(trained, lr=opts.lr, betas=(0.9, 0.98), eps=1e-9)
    scheduler = make_scheduler(optimizer, opts.schedule, tiny["d_model"], opts.warmup,
                               opts.steps)
    losses = []
    for step, world in enumerate(worlds):
        optimizer.zero_grad()
        first = None
        for rank in range(world):
            torch.manual_seed(batch_generator(opts.seed, step, rank).initial_seed())  # dropout
            loss = run.loss(model, run.batch(step, rank))
            (loss / world).backward()
            first = loss.item() if first is None else first
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        scheduler.step()
        losses.append(first)
    return losses, model


def one_rank_adam_bytes(name: str) -> int:
    """Adam's state for the whole model in one process, measured after a step."""
    model = build_model(card(name), seed=0)
    optimizer = torch.optim.Adam(model.parameters())
    sum(p.sum() for p in model.parameters()).backward()
    optimizer.step()
    return sum(t.numel() * t.element_size() for state in optimizer.state.values()
               for t in state.values())


@pytest.fixture(scope="module")
def two_rank_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict]:
    out = tmp_path_factory.mktemp("fsdp") / "run"
    return out, train_sharded(2, "llama-tiny", out)


def test_two_ranks_sharded_train_to_the_one_process_losses(two_rank_run: tuple) -> None:
    out, trainer = two_rank_run
    expected, model = reference("llama-tiny", tuple([2] * STEPS))
    assert trainer["losses"] == pytest.approx(expected, abs=LOSS_TOLERANCE)
    assert trainer["world_size"] == 2
    consolidated = load_file(str(out / "model.safetensors"))
    assert consolidated.keys() == model.state_dict().keys()
    for key, tensor in model.state_dict().items():
        torch.testing.assert_close(consolidated[key], tensor, atol=1e-5, rtol=0)


def test_each_rank_holds_about_half_of_adams_state(two_rank_run: tuple) -> None:
    _, trainer = two_rank_run
    whole = one_rank_adam_bytes("llama-tiny")
    for held in trainer["optimizer_bytes_per_rank"]:
        assert held / whole == pytest.approx(0.5, abs=0.01)


def interrupted(run: Path, at: int, into: Path) -> Path:
    """A copy of `run` as a kill just after checkpoint `at` leaves it."""
    shutil.copytree(run, into)
    for later in (into / "checkpoints").glob("step-*"):
        if int(later.name.removeprefix("step-")) > at:
            shutil.rmtree(later)
    (into / "checkpoints" / "latest").write_text(f"step-{at:08d}")
    return into


@pytest.mark.parametrize("ranks", [pytest.param(2, marks=pytest.mark.slow), 1])
def test_resume_from_a_sharded_checkpoint_on_one_or_two_ranks(two_rank_run: tuple, ranks: int,
                                                              tmp_path: Path) -> None:
    out, uninterrupted = two_rank_run
    resumed = interrupted(out, EVERY, tmp_path / "resumed")
    trainer = train_sharded(ranks, "llama-tiny", resumed, extra=("--resume",))
    if ranks == 2:  # the same ranks: the same run
        assert trainer["losses"] == pytest.approx(uninterrupted["losses"], abs=1e-6)
    else:  # on one rank from the checkpoint on: rank 0's batches only
        expected, _ = reference("llama-tiny", tuple([2] * EVERY + [1] * (STEPS - EVERY)))
        assert trainer["losses"] == pytest.approx(expected, abs=LOSS_TOLERANCE)
    assert trainer["world_size"] == ranks
    logged = [json.loads(line)["step"] for line in (resumed / "metrics.jsonl").open()]
    assert logged == sorted(set(logged))  # no step logged twice


def test_sharded_checkpoint_imports_as_a_model_folder(two_rank_run: tuple,
                                                      tmp_path: Path) -> None:
    out, _ = two_rank_run
    checkpoint = out / "checkpoints" / f"step-{EVERY:08d}"
    imported = CliRunner().invoke(main, ["import", str(checkpoint), "-o", str(tmp_path / "f")])
    assert imported.exit_code == 0, imported.output
    _, model = reference("llama-tiny", tuple([2] * EVERY))
    weights = load_file(str(tmp_path / "f" / "model.safetensors"))
    assert weights.keys() == model.state_dict().keys()
    for key, tensor in model.state_dict().items():
        torch.testing.assert_close(weights[key], tensor, atol=1e-5, rtol=0)
    assert (tmp_path / "f" / "byte-tokenizer.json").is_file()


@pytest.mark.slow
def test_sharded_checkpoint_exports_with_parity(two_rank_run: tuple, tmp_path: Path) -> None:
    out, _ = two_rank_run
    checkpoint = out / "checkpoints" / f"step-{EVERY:08d}"
    exported = CliRunner().invoke(main, ["export", str(checkpoint), "--onnx", "-o",
                                         str(tmp_path / "onnx")])
    assert exported.exit_code == 0, exported.output  # zoo export's own parity grid passed
    assert (tmp_path / "onnx" / "manifest.json").is_file()


def test_shard_full_outside_torchrun_says_to_launch_with_torchrun(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(name, raising=False)
    out = tmp_path / "out"
    result = CliRunner().invoke(main, ["train", "llama-tiny", "--task", "lm", "--steps", "2",
                                       "--shard", "full", "-o", str(out)])
    assert result.exit_code == 2, result.output
    assert "launch with torchrun" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1
    assert not out.exists()


def test_mixed_precision_without_sharding_is_refused(tmp_path: Path) -> None:
    result = CliRunner().invoke(main, ["train", "llama-tiny", "--task", "lm", "--steps", "2",
                                       "--mixed-precision", "bf16", "-o", str(tmp_path / "o")])
    assert result.exit_code == 2, result.output
    assert "use it with --shard full" in result.stderr
    assert not (tmp_path / "o").exists()


def test_bf16_where_the_device_lacks_it_is_refused(tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    for name, value in (("RANK", "0"), ("WORLD_SIZE", "1"), ("MASTER_ADDR", "127.0.0.1"),
                        ("MASTER_PORT", str(free_port()))):
        monkeypatch.setenv(name, value)  # as torchrun sets them
    monkeypatch.setattr(sharding, "bf16_supported", lambda: False)
    result = CliRunner().invoke(main, ["train", "llama-tiny", "--task", "lm", "--steps", "2",
                                       "--shard", "full", "--mixed-precision", "bf16", "-o",
                                       str(tmp_path / "o")])
    assert result.exit_code == 2, result.output
    assert "this device has no bfloat16 arithmetic" in result.stderr
    assert not (tmp_path / "o").exists()


@pytest.mark.slow
@pytest.mark.skipif(not sharding.bf16_supported(), reason="no bfloat16 arithmetic here")
def test_bf16_mixed_precision_keeps_float32_master_weights(tmp_path: Path) -> None:
    out = tmp_path / "bf16"
    trainer = train_sharded(2, "llama-tiny", out, extra=("--mixed-precision", "bf16"))
    index = json.loads((out / "checkpoints" / f"step-{STEPS:08d}" / "shards.json").read_text())
    assert {whole["dtype"] for whole in index["tensors"].values()} == {"F32"}
    expected, _ = reference("llama-tiny", tuple([2] * STEPS))
    # the loss is a bfloat16 (8 bits of mantissa: 1/32 apart near 5.6), from bfloat16 logits
    assert trainer["losses"] == pytest.approx(expected, abs=0.1)
    assert trainer["losses"] != pytest.approx(expected, abs=1e-5)  # it did compute in bf16


def test_a_sharded_checkpoint_resumes_only_sharded(two_rank_run: tuple, tmp_path: Path) -> None:
    out, _ = two_rank_run
    copy = shutil.copytree(out, tmp_path / "run")
    before = (copy / "checkpoints" / "latest").read_text()
    result = CliRunner().invoke(main, ["train", "llama-tiny", "--task", "lm", *ARGS,
                                       "--steps", str(STEPS + 2),
                                       "--resume", "-o", str(copy)])
    assert result.exit_code == 2, result.output
    assert "a checkpoint of a --shard full run; resume it with --shard full" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1
    assert (copy / "checkpoints" / "latest").read_text() == before


@pytest.mark.parametrize("damage, named, message", [
    ("truncate", 0, "bytes, shards.json says"),
    ("other slices", 0, "do not match shards.json"),
    ("delete", 1, "missing (listed in shards.json)"),
    ("stray", 2, "a shard file shards.json does not list"),
    ("gap", "shards.json", "the shards do not cover model.head.weight"),
])
def test_a_shard_that_does_not_match_the_index_is_named(two_rank_run: tuple, damage: str,
                                                        named: int | str, message: str,
                                                        tmp_path: Path) -> None:
    out, _ = two_rank_run
    checkpoint = shutil.copytree(out / "checkpoints" / f"step-{EVERY:08d}", tmp_path / "ck")
    shards = sorted(checkpoint.glob("shard-*.safetensors"))
    index = json.loads((checkpoint / "shards.json").read_text())
    if damage == "truncate":
        shards[0].write_bytes(shards[0].read_bytes()[:-100])
    elif damage == "other slices":  # the index of a run whose first rank held other slices
        index["files"][shards[0].name]["tensors"]["model.head.weight"]["offsets"][0] += 1
    elif damage == "delete":
        shards[1].unlink()
    elif damage == "stray":  # a third rank's shard left from another run
        shards.append(checkpoint / "shard-00003-model-00001-of-00001.safetensors")
        shutil.copyfile(shards[1], shards[2])
    else:  # the index says the tensor is larger than its pieces
        index["tensors"]["model.head.weight"]["shape"][0] += 1
    (checkpoint / "shards.json").write_text(json.dumps(index))
    result = CliRunner().invoke(main, ["import", str(checkpoint), "-o", str(tmp_path / "f")])
    assert result.exit_code == 2, result.output
    name = named if isinstance(named, str) else shards[named].name
    assert f"{name}: " in result.stderr and message in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "f").exists()


@pytest.mark.slow
@pytest.mark.parametrize("name", ["llama-tiny", "gemma-tiny"])
def test_fifty_steps_on_two_ranks_follow_the_one_process_losses(name: str,
                                                                tmp_path: Path) -> None:
    trainer = train_sharded(2, name, tmp_path / "run", steps=50)
    expected, _ = reference(name, tuple([2] * 50))
    assert trainer["losses"] == pytest.approx(expected, abs=LOSS_TOLERANCE)
    assert expected[-1] < expected[0] - 0.5  # it learned: the comparison is not of flat lines


@pytest.mark.slow
def test_lora_adapters_shard_and_train_as_in_one_process(tmp_path: Path) -> None:
    out = tmp_path / "lora"
    trainer = train_sharded(2, "llama-tiny", out, extra=("--lora", "4"))
    expected, model = reference("llama-tiny", tuple([2] * STEPS), lora=4)
    assert trainer["losses"] == pytest.approx(expected, abs=LOSS_TOLERANCE)
    base = load_file(str(out / "model.safetensors"))
    assert base.keys() == build_model(card("llama-tiny"), seed=3).state_dict().keys()
    for key, tensor in build_model(card("llama-tiny"), seed=3).state_dict().items():
        assert torch.equal(base[key], tensor)  # the frozen base, as it came
    adapter = load_file(str(out / "adapter_model.safetensors"))
    trained = {k: v for k, v in model.state_dict().items() if "lora_" in k}
    assert len(adapter) == len(trained) == 8
    for key, tensor in trained.items():  # PEFT names end as the zoo's: ...query.lora_A.weight
        layer, rest = key.removeprefix("layers.").split(".", 1)
        peft = next(k for k in adapter if f"layers.{layer}." in k and
                    k.endswith(rest.replace("self_attention.query", "q_proj")
                               .replace("self_attention.value", "v_proj")))
        torch.testing.assert_close(adapter[peft], tensor, atol=1e-5, rtol=0)


@pytest.mark.slow
def test_two_torchrun_agents_as_two_nodes_train(tmp_path: Path) -> None:
    """`--nnodes 2 --rdzv-backend c10d`: two agents on this machine, one rank each."""
    out, port = tmp_path / "nodes", free_port()
    launcher = ["--nnodes", "2", "--rdzv-backend", "c10d", "--rdzv-endpoint",
                f"127.0.0.1:{port}", "--rdzv-id", "zoo-test"]
    args = ["llama-tiny", "--task", "lm", *ARGS, "--steps", "4", "--checkpoint-every", "2",
            "--shard", "full", "-o", str(out)]
    with ThreadPoolExecutor(2) as pool:
        results = list(pool.map(lambda _: torchrun(1, args, tmp_path, launcher=launcher),
                                range(2)))
    for result in results:
        assert result.returncode == 0, result.stderr[-3000:]
    trainer = json.loads((out / "checkpoints" / "step-00000004" / "trainer.json").read_text())
    assert trainer["world_size"] == 2
    expected, _ = reference("llama-tiny", tuple([2] * 4))
    assert trainer["losses"] == pytest.approx(expected, abs=LOSS_TOLERANCE)


@pytest.mark.slow
def test_an_encoder_decoder_shards_both_stacks(tmp_path: Path) -> None:
    """transformer-tiny, --task copy (the paper's schedule, label smoothing): its encoder's and
    decoder's layers are units as a decoder's are, no family named."""
    trainer = train_sharded(2, "transformer-tiny", tmp_path / "copy", task="copy")
    expected, model = reference("transformer-tiny", tuple([2] * STEPS), task="copy")
    assert trainer["losses"] == pytest.approx(expected, abs=LOSS_TOLERANCE)
    weights = load_file(str(tmp_path / "copy" / "model.safetensors"))
    for key, tensor in model.state_dict().items():
        torch.testing.assert_close(weights[key], tensor, atol=1e-5, rtol=0)


@pytest.mark.slow
def test_force_over_an_existing_out_replaces_it(two_rank_run: tuple, tmp_path: Path) -> None:
    out, uninterrupted = two_rank_run
    again = shutil.copytree(out, tmp_path / "again")
    (again / "checkpoints" / "step-00000099").mkdir()  # only the old OUT has it
    trainer = train_sharded(2, "llama-tiny", again, extra=("--force",))
    assert trainer["losses"] == pytest.approx(uninterrupted["losses"], abs=1e-6)
    assert sorted(p.name for p in (again / "checkpoints").iterdir()) == \
        ["latest", f"step-{EVERY:08d}", f"step-{STEPS:08d}"]
