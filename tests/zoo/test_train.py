"""Training: the paper's schedule, the copy task, lm below the unigram entropy, exact resume,
safe checkpoints, data parallelism, and bad input."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import torch
from click.testing import CliRunner

from cli import main
from export.opening import open_model
from export.pipeline import export_and_verify
from runtime.files.tokenizer import ByteTokenizer, load_tokenizer
from runtime.generate import generate
from tests.conftest import ON_TRAINED, card, traces_reused
from zoo.assemble import build_model
from zoo.files.weights import load_built
from zoo.training import checkpoints
from zoo.training.checkpoints import latest_checkpoint
from zoo.training.data import SHIPPED_TEXT, copy_sequences
from zoo.training.schedules import make_scheduler
from zoo.training.tasks import TrainingTask
from zoo.training.train import TrainingError, TrainOptions, train

REPO = Path(__file__).resolve().parents[2]


def options(out: Path, **overrides: object) -> TrainOptions:
    base = {"task": "lm", "out": out, "steps": 40, "batch_size": 8, "block_size": 32,
            "checkpoint_every": 20, "seed": 3}
    return TrainOptions(**{**base, **overrides})


def test_noam_schedule_equals_the_papers_formula() -> None:
    d_model, warmup = 512, 4000
    optimizer = torch.optim.Adam([torch.nn.Parameter(torch.zeros(1))], lr=1.0)
    scheduler = make_scheduler(optimizer, "noam", d_model, warmup, total=20000)
    for step in range(1, 20001):  # the rate used at `step`, counted from 1 as in the paper
        if step in (1, 10, 100, 3999, 4000, 4001, 10000, 20000):
            paper = d_model**-0.5 * min(step**-0.5, step * warmup**-1.5)
            assert optimizer.param_groups[0]["lr"] == pytest.approx(paper, rel=1e-12)
        optimizer.step()
        scheduler.step()


def test_cosine_schedule_warms_up_then_decays_to_a_tenth() -> None:
    optimizer = torch.optim.Adam([torch.nn.Parameter(torch.zeros(1))], lr=2.0)
    scheduler = make_scheduler(optimizer, "cosine", 64, warmup=10, total=110)
    rates = []
    for _ in range(110):
        rates.append(optimizer.param_groups[0]["lr"])
        optimizer.step()
        scheduler.step()
    assert rates[0] == pytest.approx(0.2) and rates[9] == pytest.approx(2.0)
    assert rates[-1] == pytest.approx(0.2)
    assert all(a >= b for a, b in zip(rates[9:-1], rates[10:], strict=True))


# slow: 1,000 steps (35 s on 2 cores); the encoder-decoder's training is shown in the default
# run by tests/zoo/test_reverse.py::test_train_export_evaluate_end_to_end
@pytest.mark.slow
def test_copy_task_transformer_tiny_copies_held_out_sequences(tmp_path: Path) -> None:
    """A margin, not bit-exactness: float kernels differ by CPU (on AVX-512 FP16 one symbol of
    500 came out wrong), while an untrained model copies about one symbol in ten."""
    tiny = card("transformer-tiny")
    model = build_model(tiny, seed=0)
    train(model, tiny, options(tmp_path / "copy", task="copy", steps=1000, batch_size=32,
                               checkpoint_every=1000))
    held_out = copy_sequences(50, 10, 10, torch.Generator().manual_seed(12345)).numpy()
    copied = generate(open_model(model, tiny), held_out, None, 11, eos=tiny["eos_token_id"])
    symbols_right = float((copied[:, :10] == held_out).mean())
    rows_exact = float((copied[:, :10] == held_out).all(axis=1).mean())
    assert symbols_right >= 0.98, symbols_right
    assert rows_exact >= 0.9, rows_exact
    assert float((copied[:, 10] == tiny["eos_token_id"]).mean()) >= 0.9


def unigram_entropy(text: str) -> float:
    counts = Counter(text.encode("utf-8"))
    total = sum(counts.values())
    return -sum(c / total * math.log(c / total) for c in counts.values())


# llama: a Tiny Llama, with GQA; gemma: local layers, sandwich norms, GeGLU. The same loop
# and loss on each card (their blocks are checked against references in tests/zoo): gpt-tiny
# in the default run, the others in make test-slow.
@pytest.mark.parametrize("name", ["gpt-tiny",
                                  pytest.param("llama-tiny", marks=pytest.mark.slow),
                                  pytest.param("gemma-tiny", marks=pytest.mark.slow)])
def test_lm_brings_loss_well_below_the_unigram_entropy(tmp_path: Path, name: str) -> None:
    entropy = unigram_entropy(SHIPPED_TEXT.read_text(encoding="utf-8"))  # ~3.3 nats
    tiny = card(name)
    result = train(build_model(tiny), tiny, options(tmp_path / "lm", steps=200, batch_size=16,
                                                   block_size=64, lr=3e-3, checkpoint_every=200))
    final = float(np.mean(result["losses"][-10:]))
    assert final < 0.85 * entropy, (final, entropy)


def test_mlm_trains_an_encoder(tmp_path: Path) -> None:
    tiny = card("bert-tiny")
    result = train(build_model(tiny), tiny, options(tmp_path / "mlm", task="mlm", steps=60,
                                                   lr=3e-3, checkpoint_every=60))
    assert np.mean(result["losses"][-10:]) < np.mean(result["losses"][:10]) - 1.0


class Interrupt(Exception):
    pass


def test_interrupted_then_resumed_equals_uninterrupted(tmp_path: Path) -> None:
    tiny = card("gpt-tiny")
    whole = train(build_model(tiny, seed=3), tiny, options(tmp_path / "whole"))

    def stop_after_25(step: int, *rest: float) -> None:
        if step >= 25:
            raise Interrupt  # a kill between checkpoints (the last one is step 20)

    with pytest.raises(Interrupt):
        train(build_model(tiny, seed=3), tiny, options(tmp_path / "cut"), stop_after_25,
              log_every=1)
    assert latest_checkpoint(tmp_path / "cut").step == 20
    resumed = train(build_model(tiny, seed=99), tiny, options(tmp_path / "cut", resume=True))
    assert resumed["losses"] == whole["losses"]  # bit for bit: same batches, same rounding
    a, _ = load_built(tmp_path / "whole")
    b, _ = load_built(tmp_path / "cut")
    for (name, x), (_, y) in zip(a.state_dict().items(), b.state_dict().items(), strict=True):
        assert torch.equal(x, y), name
    assert (tmp_path / "whole" / "model.safetensors").read_bytes() == \
        (tmp_path / "cut" / "model.safetensors").read_bytes()


def folder_bytes(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*"))
            if p.is_file()}


def test_force_stages_the_new_run_and_a_failed_one_leaves_the_old_out(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    tiny = card("gpt-tiny")
    out = tmp_path / "run"
    train(build_model(tiny), tiny, options(out, steps=10, checkpoint_every=10))
    before = folder_bytes(out)

    def stop_at_5(step: int, *rest: float) -> None:
        if step >= 5:
            raise Interrupt

    with pytest.raises(Interrupt):
        train(build_model(tiny), tiny, options(out, steps=20, force=True), stop_at_5,
              log_every=1)
    assert folder_bytes(out) == before  # the old OUT, untouched while the new one trained
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run"]  # no staging left behind
    seen: list[bool] = []
    train(build_model(tiny), tiny, options(out, steps=20, force=True, checkpoint_every=20),
          lambda step, *rest: seen.append(folder_bytes(out) == before), log_every=5)
    assert seen == [True] * 4  # OUT is replaced only when the new run is done
    assert latest_checkpoint(out).step == 20
    assert sorted(p.name for p in (out / "checkpoints").iterdir()) == ["latest", "step-00000020"]


def test_a_kill_during_a_checkpoint_write_keeps_the_previous_one(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    tiny = card("gpt-tiny")
    real_save = checkpoints.save
    calls = []

    def dies_on_second_checkpoint(tensors: dict, *args: object, **kwargs: object) -> bytes:
        calls.append(1)
        if len(calls) == 2:
            raise KeyboardInterrupt  # mid-way: model file written, optimizer file not
        return real_save(tensors, *args, **kwargs)

    monkeypatch.setattr(checkpoints, "save", dies_on_second_checkpoint)
    with pytest.raises(KeyboardInterrupt):
        train(build_model(tiny), tiny, options(tmp_path / "run"))
    monkeypatch.setattr(checkpoints, "save", real_save)
    last = latest_checkpoint(tmp_path / "run")
    assert last.step == 20
    assert sorted(p.name for p in (tmp_path / "run" / "checkpoints").iterdir()) == \
        ["latest", "step-00000020"]  # no half-written step-40
    load_built(tmp_path / "run")
    ran: list[int] = []
    resumed = train(build_model(tiny), tiny, options(tmp_path / "run", resume=True),
                    lambda step, *rest: ran.append(step), log_every=1)
    assert ran == list(range(21, 41))  # only the steps after the kept checkpoint
    assert len(resumed["losses"]) == 40  # 20 restored + 20 new
    assert sorted(p.name for p in (tmp_path / "run" / "checkpoints").iterdir()) == \
        ["latest", "step-00000020", "step-00000040"]
    assert latest_checkpoint(tmp_path / "run").step == 40


def test_nan_loss_stops_with_the_step_and_keeps_the_last_good_checkpoint(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    tiny = card("gpt-tiny")
    real_loss = TrainingTask.loss  # what the lm task computes its loss with
    steps = []

    def nan_at_step_30(self: TrainingTask, model: torch.nn.Module, batch: object
                       ) -> torch.Tensor:
        steps.append(1)
        loss = real_loss(self, model, batch)
        return loss * float("nan") if len(steps) == 30 else loss

    monkeypatch.setattr(TrainingTask, "loss", nan_at_step_30)
    with pytest.raises(TrainingError, match=r"step 30: loss is nan.*last good checkpoint: step 20"):
        train(build_model(tiny), tiny, options(tmp_path / "run"))
    assert latest_checkpoint(tmp_path / "run").step == 20
    model, _ = load_built(tmp_path / "run")
    assert all(torch.isfinite(p).all() for p in model.parameters())


def test_two_process_torchrun_keeps_ranks_in_sync(tmp_path: Path) -> None:
    out = tmp_path / "ddp"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone",
               "--nproc_per_node", "2", str(REPO / "cli.py"), "train", "gpt-tiny", "--task", "lm",
               "--steps", "12", "--batch-size", "4", "--block-size", "32",
               "--checkpoint-every", "6", "-o", str(out)]
    result = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True,
                            timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    trainer = json.loads((out / "checkpoints" / "step-00000012" / "trainer.json").read_text())
    assert trainer["world_size"] == 2
    assert trainer["rank_parameter_spread"] == 0.0
    assert result.stdout.count("trained gpt-tiny") == 1  # only rank 0 reports


@ON_TRAINED
def test_trained_model_round_trips_through_export_and_zoo_run_text(
        trained_gpt_tiny: Callable[[], Path], shared_traces: dict, tmp_path: Path) -> None:
    """The trained folder's weights and tokenizer through export and `zoo run --text` (its
    model.onnx trace is shared with tests/clients/test_serving.py's export of the same weights)."""
    tiny = card("gpt-tiny")
    folder = trained_gpt_tiny()
    assert isinstance(load_tokenizer(folder), ByteTokenizer)
    trained, loaded = load_built(folder)
    with traces_reused(shared_traces):
        export_and_verify(trained, loaded, tmp_path / "onnx", source_folder=folder)
    prompt = "ROMEO:"
    result = CliRunner().invoke(main, ["run", str(tmp_path / "onnx"), "--text", prompt,
                                       "--max-new-tokens", "40"])
    assert result.exit_code == 0, result.output
    tokenizer = ByteTokenizer()
    expected = generate(open_model(trained, loaded), np.array([tokenizer.encode(prompt)]), None,
                        40, eos=tiny["eos_token_id"])[0]
    assert result.stdout.rstrip("\n") == prompt + tokenizer.decode(expected.tolist())


@pytest.mark.parametrize("args, message", [
    (["gpt-tiny", "--task", "lm", "--data", "{tmp}/missing.txt"], "no such data file"),
    (["gpt-tiny", "--task", "lm", "--data", "{tmp}/empty.txt"], "data file is empty"),
    (["gpt-tiny", "--task", "lm", "--data", "{tmp}/latin1.txt"], "not UTF-8"),
    (["gpt-tiny", "--task", "lm", "--data", "{tmp}/short.txt"], "shorter than one batch"),
    (["bert-tiny", "--task", "copy"], "--task copy trains a encoder-decoder"),
    (["gpt-tiny", "--task", "mlm"], "but gpt-tiny is a decoder"),
    (["gpt-tiny", "--task", "lm", "--resume"], "no checkpoint there"),
])
def test_bad_training_input(args: list[str], message: str, tmp_path: Path) -> None:
    (tmp_path / "empty.txt").write_text("  \n")
    (tmp_path / "latin1.txt").write_bytes("caf\xe9 ".encode("latin-1") * 100)
    (tmp_path / "short.txt").write_text("too short")
    out = tmp_path / "out"
    args = [a.format(tmp=tmp_path) for a in args] + ["-o", str(out), "--steps", "2"]
    result = CliRunner().invoke(main, ["train", *args])
    assert result.exit_code == 2, result.output
    assert message in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1
    assert not out.exists()


def test_resume_with_another_cards_checkpoint_is_refused(tmp_path: Path) -> None:
    runner = CliRunner()
    out = str(tmp_path / "run")
    first = runner.invoke(main, ["train", "gpt-tiny", "--task", "lm", "--steps", "4",
                                 "--batch-size", "2", "--block-size", "16", "-o", out])
    assert first.exit_code == 0, first.output
    before = (tmp_path / "run" / "model.safetensors").read_bytes()
    other = tmp_path / "other.yaml"
    other.write_text("extends: gpt-tiny\nn_layers: 3\n")
    result = runner.invoke(main, ["train", "other", "--registry", str(tmp_path), "--task", "lm",
                                  "--steps", "8", "-o", out, "--resume"])
    assert result.exit_code == 2
    assert "differs from 'other' in n_layers" in result.stderr
    assert (tmp_path / "run" / "model.safetensors").read_bytes() == before
    again = runner.invoke(main, ["train", "gpt-tiny", "--task", "lm", "--steps", "4", "-o", out])
    assert again.exit_code == 2 and "already exists" in again.stderr
