"""Training: the paper's recipe for the encoder-decoder, next-token and masked-token training
for the decoder and encoder, fine-tuning a classifier on labelled text (both), checkpoints with
exact resume, and data parallelism (DDP).

Run under `torchrun --nproc_per_node N` the same code trains data-parallel: gloo on CPU, nccl on
CUDA; each rank draws its own batches; only rank 0 writes files and reports progress. With
`--shard full` the model is sharded with FSDP2 instead of replicated (sharding.py), and its
checkpoints are DCP's, one shard a rank (sharded_checkpoints.py).
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import shutil
import time
import warnings
from collections.abc import Callable
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

import registry.experts as experts
from registry.catalog import Card
from registry.errors import ZooError
from registry.paths import display_path
from runtime.files.atomic import atomic_folder, atomic_write_bytes, refuse_existing
from runtime.files.lock import output_lock
from zoo.files.weights import CONFIG, WEIGHTS, card_yaml, read_tensors
from zoo.training import classify, data, sharded_checkpoints, sharding
from zoo.training.checkpoints import (
    CHECKPOINTS,
    LATEST,
    latest_checkpoint,
    restore,
    save_checkpoint,
    trainable,
)
from zoo.training.experts import Routed, routed
from zoo.training.metrics import append_metrics, truncate_metrics
from zoo.training.schedules import make_scheduler
from zoo.training.tasks import TASKS, Task, TrainOptions

Progress = Callable[[int, int, float, float, float], None]  # step, total, loss, lr, tokens/s
Evaluated = Callable[[int, dict[str, Any]], None]  # step, scores on the held-out rows
Finish = Callable[[nn.Module, Path], None]  # the trained model, the folder it lands in


class TrainingError(ZooError):
    """Training stopped: a NaN loss, or a checkpoint that does not fit."""


def _check_fit(card: Card, options: TrainOptions) -> None:
    task = TASKS.get(options.task)
    if task is None:
        raise ZooError(f"--task {options.task}: expected one of {', '.join(TASKS)}")
    if card.family not in task.trains:
        raise ZooError(f"--task {options.task} trains a {' or '.join(task.trains)}, but "
                       f"{card.name} is a {card.family} (use " + ", ".join(
                           f"--task {t} for a {' or '.join(d.trains)}" for t, d in TASKS.items())
                       + ")")
    options.check()
    task.check(card, options)


def _distributed(options: TrainOptions) -> tuple[int, int]:
    """(rank, world size); starts the process group when launched by torchrun (always for
    --shard full, which refuses to run without one)."""
    if options.shard == "full":
        sharding.check_launch(options.mixed_precision)
        return sharding.start_process_group()
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world > 1 and not dist.is_initialized():
        dist.init_process_group("nccl" if torch.cuda.is_available() else "gloo")
    return (dist.get_rank(), world) if world > 1 else (0, 1)


def _parameter_spread(model: nn.Module) -> float:
    """Largest difference of any parameter across ranks (0 when they are in sync)."""
    flat = torch.cat([p.detach().flatten() for p in model.parameters()])
    high, low = flat.clone(), flat.clone()
    dist.all_reduce(high, dist.ReduceOp.MAX)
    dist.all_reduce(low, dist.ReduceOp.MIN)
    return float((high - low).abs().max())


def _prepare_out(card: Card, options: TrainOptions, writer: bool):
    """The checkpoint to resume from (or None), after the checks on OUT."""
    out = options.out
    if options.resume:
        checkpoint = latest_checkpoint(out) if out.exists() else None
        if checkpoint is None:
            raise ZooError(f"{display_path(out)}: --resume, but there is no checkpoint there")
        if checkpoint.trainer.get("sharded", False) != (options.shard == "full"):
            made = "--shard full" if checkpoint.trainer.get("sharded") else "--shard none"
            raise ZooError(f"{display_path(checkpoint.folder)}: a checkpoint of a {made} run; "
                           f"resume it with {made}")
        saved = checkpoint.trainer.get("card", {})
        if saved != card.fields:
            changed = sorted(k for k in card.fields if saved.get(k) != card.fields[k])
            raise ZooError(f"{display_path(checkpoint.folder)}: checkpoint is for card "
                           f"'{checkpoint.trainer.get('card_name')}', which differs from "
                           f"'{card.name}' in {', '.join(changed) or 'its fields'}")
        return checkpoint
    if writer:
        refuse_existing(out, options.force)  # an existing OUT under --force is staged
    return None


def train(model: nn.Module, card: Card, options: TrainOptions,
          progress: Progress = lambda *args: None, log_every: int = 10,
          evaluated: Evaluated = lambda *args: None,
          files: dict[str, bytes] | None = None,
          finish: Finish | None = None) -> dict[str, Any]:
    """Train `model` in place; returns the final trainer state (step, losses, ...).

    `files` are written into OUT at the start (classify: init.json). With held-out rows
    (classify), each checkpoint step is evaluated (`evaluated(step, scores)`, and the scores
    in metrics.jsonl) and the last evaluation is OUT/eval.json. `--force` over an existing
    OUT trains into a staged folder that replaces OUT only once training is done: a failed or
    interrupted run leaves the old OUT as it was. `finish(model, folder)` writes the trained
    model's own files into OUT last (--lora: the base's weights and the adapter apart)."""
    _check_fit(card, options)  # first: the defaults depend on a known task
    options = options.resolved(card)
    rank, world = _distributed(options)
    with output_lock(options.out) if rank == 0 else contextlib.nullcontext():
        if rank == 0 and options.force and not options.resume and options.out.exists():
            with atomic_folder(options.out, force=True) as staging:
                return _train(model, card, replace(options, out=staging), rank, world,
                              progress, log_every, evaluated, files, shown=options.out,
                              finish=finish)
        made = rank == 0 and not options.out.exists()  # this run's own OUT, not the user's
        try:
            return _train(model, card, options, rank, world, progress, log_every, evaluated,
                          files, shown=options.out, finish=finish)
        except BaseException:
            if made:
                _remove_unresumable(options.out)
            raise


def _remove_unresumable(out: Path) -> None:
    """A failed run's OUT goes unless it holds a checkpoint, which is what --resume takes."""
    if not (out / CHECKPOINTS / LATEST).is_file():
        shutil.rmtree(out, ignore_errors=True)


def _optimizer(model: nn.Module, card: Card, options: TrainOptions, checkpoint: Any
               ) -> tuple[torch.optim.Optimizer, Any, int, list[float]]:
    """Adam (the paper's betas and eps) and the schedule, at the checkpoint's step when
    resuming: (optimizer, scheduler, first step, the losses so far)."""
    optimizer = torch.optim.Adam(trainable(model).values(), lr=options.lr, betas=(0.9, 0.98),
                                 eps=1e-9)  # a frozen base (--lora): its adapters only
    start, losses = 0, []
    if checkpoint is not None:
        if options.shard == "full":
            sharded_checkpoints.load_sharded(checkpoint.folder, model, optimizer,
                                             checkpoint.trainer)
        else:
            restore(checkpoint, model, optimizer)
        start, losses = checkpoint.step, checkpoint.trainer["losses"]
    scheduler = make_scheduler(optimizer, options.schedule, card["d_model"], options.warmup,
                               options.steps)
    with warnings.catch_warnings():  # fast-forwarding, so no optimizer.step() comes first
        warnings.filterwarnings("ignore", message="Detected call of `lr_scheduler.step")
        for _ in range(start):  # the schedule is a pure function of the step
            scheduler.step()
    return optimizer, scheduler, start, losses


def _start_out(options: TrainOptions, card: Card, start: int, files: dict[str, bytes]) -> None:
    """OUT's card and files before the first step; a resumed run logs its steps once."""
    options.out.mkdir(parents=True, exist_ok=True)
    truncate_metrics(options.out, start)
    atomic_write_bytes(options.out / CONFIG, card_yaml(card).encode())
    for name, content in files.items():
        atomic_write_bytes(options.out / name, content)


def _log(options: TrainOptions, done: int, loss: float, lr: float, rate: float,
         scores: dict[str, Any] | None, progress: Progress, evaluated: Evaluated,
         routing: Routed | None = None, logged: tuple[str, ...] = ()) -> None:
    """A line of metrics.jsonl (with the held-out scores the task logs at a checkpoint, and a
    mixture of experts' router loss and load) and the progress."""
    record = {"step": done, "loss": loss, "lr": lr, "tokens_per_s": rate}
    if routing is not None:
        record |= {"router_loss": routing.loss.item(), "expert_load": routing.load}
    if scores:
        record |= {f"eval_{name}": scores[name] for name in logged}
    append_metrics(options.out, record)
    progress(done, options.steps, loss, lr, rate)
    if scores:
        evaluated(done, scores)


def _stopped(step: int, loss: float, out: Path, shown: Path) -> TrainingError:
    last = latest_checkpoint(out)
    if out != shown:  # staged under --force: the old OUT stays
        kept = f"{display_path(shown)} left as it was"
    elif last:
        kept = f"last good checkpoint: step {last.step} in {display_path(shown)}"
    else:
        kept = f"no checkpoint yet: {display_path(shown)} not kept"
    return TrainingError(f"step {step + 1}: loss is {loss}; stopped ({kept})")


def _consolidated_out(out: Path, twin: nn.Module | None, finish: Finish | None) -> None:
    """OUT's model.safetensors streamed from the last (sharded) checkpoint; with `finish`
    (--lora), the model rebuilt from it on rank 0 writes OUT's files instead."""
    last = latest_checkpoint(out)
    assert last is not None  # the last step is always a checkpoint step
    partial = out / f".{WEIGHTS}.partial"
    try:
        sharded_checkpoints.consolidate(last.folder, partial)
        if twin is None or finish is None:
            os.replace(partial, out / WEIGHTS)
            return
        twin.load_state_dict(read_tensors(partial), assign=True)
        finish(twin, out)
    finally:
        partial.unlink(missing_ok=True)


def _train(model: nn.Module, card: Card, options: TrainOptions, rank: int, world: int,
           progress: Progress, log_every: int, evaluated: Evaluated,
           files: dict[str, bytes] | None, shown: Path, finish: Finish | None = None
           ) -> dict[str, Any]:
    """The loop, writing into `options.out` (OUT, or its staged replacement); messages name
    `shown`, the OUT the user asked for."""
    writer = rank == 0
    sharded = options.shard == "full"
    if sharded:  # every rank writes its shards where rank 0 trains (--force: a staged OUT)
        options = replace(options, out=sharding.rank_zeros(options.out))
    task = Task(card, options)
    checkpoint = _prepare_out(card, options, writer)
    twin = sharding.meta_twin(model) if sharded and writer and finish else None
    if sharded:
        sharding.shard_model(model, options.mixed_precision)
    optimizer, scheduler, start, losses = _optimizer(model, card, options, checkpoint)
    if writer:
        _start_out(options, card, start, {**task.files(), **(files or {})})
    trained = nn.parallel.DistributedDataParallel(model) if world > 1 and not sharded else model
    trained.train()

    def state(step: int) -> dict[str, Any]:
        return {"step": step, "card_name": card.name, "card": card.fields, "losses": losses,
                "world_size": world, "rank": rank,
                "options": {k: str(v) for k, v in asdict(options).items()}}

    started, tokens, scores = time.perf_counter(), 0, None
    for step in range(start, options.steps):
        batch = task.batch(step, rank)
        torch.manual_seed(data.batch_generator(options.seed, step, rank).initial_seed())
        loss = task.loss(trained, batch)
        routing = routed(model, card["n_experts"], card["n_experts_per_token"]) \
            if card["activation"] == experts.NAME else None
        if routing is not None:  # the router's load-balancing loss (zoo/training/experts.py)
            loss = loss + card["router_aux_loss_coef"] * routing.loss
        if not math.isfinite(loss.item()):
            raise _stopped(step, loss.item(), options.out, shown)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        nn.utils.clip_grad_norm_(model.parameters(), options.clip)
        lr = optimizer.param_groups[0]["lr"]
        optimizer.step()
        scheduler.step()
        losses.append(round(loss.item(), 6))
        tokens += batch.tokens * world
        done = step + 1
        checkpoint_step = done % options.checkpoint_every == 0 or done == options.steps
        scores = task.evaluate(model) if writer and checkpoint_step else None
        if writer and (done % log_every == 0 or done == options.steps or scores):
            rate = tokens / max(time.perf_counter() - started, 1e-9)
            _log(options, done, loss.item(), lr, rate, scores, progress, evaluated, routing,
                 task.logged)
        if checkpoint_step and sharded:
            held = sharded_checkpoints.optimizer_bytes_per_rank(model, optimizer)
            sharded_checkpoints.save_sharded(options.out, model, optimizer,
                                             {**state(done), "optimizer_bytes_per_rank": held},
                                             card_yaml(card))
        elif checkpoint_step:
            spread = _parameter_spread(model) if world > 1 else 0.0
            if writer:
                save_checkpoint(options.out, model, optimizer,
                                {**state(done), "rank_parameter_spread": spread})
    model.eval()
    final = state(options.steps)
    if writer and scores is not None:  # the last step is a checkpoint step: its evaluation
        atomic_write_bytes(options.out / classify.EVAL_RECORD,
                           (json.dumps({"step": options.steps, **scores}, indent=1) + "\n"
                            ).encode())
        final["eval"] = scores
    if writer and sharded:
        _consolidated_out(options.out, twin, finish)
    elif writer and finish is not None:
        finish(model, options.out)
    if dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()
    return final
