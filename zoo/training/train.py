"""Training: the paper's recipe for the encoder-decoder, next-token and masked-token training
for the decoder and encoder, fine-tuning a classifier on labelled text (both), checkpoints with
exact resume, and data parallelism (DDP).

Run under `torchrun --nproc_per_node N` the same code trains data-parallel: gloo on CPU, nccl on
CUDA; each rank draws its own batches; only rank 0 writes files and reports progress.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import time
import warnings
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from registry.catalog import Card
from registry.errors import ZooError
from registry.paths import display_path
from zoo.files.atomic import atomic_folder, atomic_write_bytes, refuse_existing
from zoo.files.lock import output_lock
from zoo.files.tokenizer import BYTE_TOKENIZER, WORD_TOKENIZER, ByteTokenizer, tokenizer_files
from zoo.files.weights import CONFIG, card_yaml
from zoo.training import classify, data, reverse
from zoo.training.checkpoints import latest_checkpoint, restore, save_checkpoint
from zoo.training.metrics import append_metrics, truncate_metrics
from zoo.training.schedules import make_scheduler


@dataclass(frozen=True)
class TaskDefaults:
    """What a task trains and how, unless the command line says otherwise."""

    trains: tuple[str, ...]  # the families it trains
    schedule: str  # noam: the paper's schedule for the encoder-decoder
    label_smoothing: float


TASKS = {
    "lm": TaskDefaults(("decoder",), "cosine", 0.0),
    "mlm": TaskDefaults(("encoder",), "cosine", 0.0),
    "copy": TaskDefaults(("encoder-decoder",), "noam", 0.1),  # Vaswani et al. 2017
    "reverse": TaskDefaults(("encoder-decoder",), "noam", 0.1),  # zoo/training/reverse.py
    "classify": TaskDefaults(("encoder", "decoder"), "cosine", 0.0),  # zoo/training/classify.py
}


@dataclass
class TrainOptions:
    task: str
    out: Path
    data: Path | None = None
    steps: int = 300
    batch_size: int = 32
    block_size: int = 128  # capped at the card's max_positions
    lr: float | None = None  # noam: a factor (1.0 = the paper); cosine: the peak rate
    schedule: str | None = None  # noam for the encoder-decoder, cosine otherwise
    warmup: int | None = None  # 400 for noam, 100 for cosine
    label_smoothing: float | None = None  # 0.1 for the encoder-decoder (the paper), else 0
    clip: float = 1.0
    checkpoint_every: int = 100
    seed: int = 0
    resume: bool = False
    force: bool = False
    copy_length: int = 10
    copy_symbols: int = 10
    eval: Path | None = None  # classify: held-out rows, or
    eval_fraction: float | None = None  # classify: the share of --data held out
    tokenizer_folder: Path | None = None  # classify: where the texts' tokenizer is (SOURCE)

    def resolved(self, card: Card) -> TrainOptions:
        defaults = TASKS[self.task]
        schedule = self.schedule or defaults.schedule
        return TrainOptions(**{
            **asdict(self),
            "schedule": schedule,
            "lr": self.lr if self.lr is not None else (1.0 if schedule == "noam" else 1e-3),
            "warmup": self.warmup or (400 if schedule == "noam" else 100),
            "label_smoothing": self.label_smoothing if self.label_smoothing is not None
            else defaults.label_smoothing,
            "block_size": min(self.block_size, card["max_positions"]),
        })


Progress = Callable[[int, int, float, float, float], None]  # step, total, loss, lr, tokens/s
Evaluated = Callable[[int, dict[str, Any]], None]  # step, scores on the held-out rows


class TrainingError(ZooError):
    """Training stopped: a NaN loss, or a checkpoint that does not fit."""


def _check_fit(card: Card, options: TrainOptions) -> None:
    defaults = TASKS.get(options.task)
    if defaults is None:
        raise ZooError(f"--task {options.task}: expected one of {', '.join(TASKS)}")
    if card.family not in defaults.trains:
        raise ZooError(f"--task {options.task} trains a {' or '.join(defaults.trains)}, but "
                       f"{card.name} is a {card.family} (use " + ", ".join(
                           f"--task {t} for a {' or '.join(d.trains)}" for t, d in TASKS.items())
                       + ")")
    if options.steps < 1 or options.batch_size < 1:
        raise ZooError("--steps and --batch-size should be >= 1")
    if options.task in ("lm", "mlm") and card["vocab_size"] < ByteTokenizer().vocab_size:
        raise ZooError(f"{card.name}: vocab_size={card['vocab_size']} is too small for the byte "
                       f"tokenizer (needs {ByteTokenizer().vocab_size})")
    if options.task == "classify" and (options.data is None or not card["num_labels"]):
        raise ZooError("--task classify needs --data FILE (labelled rows) and a classifier "
                       "card (zoo.training.classify.prepare_classifier makes one)")
    if options.task == "mlm" and card["mask_token_id"] is None:
        raise ZooError(f"{card.name}: --task mlm needs mask_token_id in the card")
    if options.task == "reverse":
        if reverse.LONGEST + 1 > card["max_positions"] or card["vocab_size"] < 16:
            raise ZooError(f"{card.name}: --task reverse needs max_positions >= "
                           f"{reverse.LONGEST + 1} and vocab_size >= 16")
    if options.task == "copy":
        if options.copy_length + 1 > card["max_positions"]:
            raise ZooError(f"copy length {options.copy_length} exceeds max_positions")
        if 3 + options.copy_symbols > card["vocab_size"]:
            raise ZooError(f"{card.name}: vocab_size={card['vocab_size']} is too small for "
                           f"{options.copy_symbols} copy symbols")


class Task:
    """Makes the batch for a step and computes its loss."""

    def __init__(self, card: Card, options: TrainOptions) -> None:
        self.card, self.options = card, options
        self.ids: torch.Tensor | None = None
        self.labelled: classify.ClassifyData | None = None
        if options.task == "classify":
            self.tokenizer = classify.text_tokenizer(options.tokenizer_folder)
            self.labelled = classify.ClassifyData.read(
                card, self.tokenizer, options.data, options.eval, options.eval_fraction,
                options.seed, options.block_size)
        if options.task in ("lm", "mlm"):
            path = options.data or data.SHIPPED_TEXT
            self.ids = data.read_text_tokens(path, ByteTokenizer(),
                                             options.block_size + 1)

    def batch(self, step: int, rank: int) -> data.Batch:
        generator = data.batch_generator(self.options.seed, step, rank)
        o, c = self.options, self.card
        if o.task == "lm":
            return data.lm_batch(self.ids, o.batch_size, o.block_size, generator)
        if o.task == "classify":
            rows = self.labelled.train
            chosen = torch.randint(0, len(rows.ids), (o.batch_size,), generator=generator)
            ids, mask = classify.padded([rows.ids[i] for i in chosen.tolist()],
                                        c["pad_token_id"])
            labels = torch.tensor([rows.labels[i] for i in chosen.tolist()])
            return data.Batch({"input_ids": ids, "attention_mask": mask}, labels,
                              int(mask.sum()))
        if o.task == "mlm":
            return data.mlm_batch(self.ids, o.batch_size, o.block_size, generator,
                                  c["mask_token_id"], c["vocab_size"])
        if o.task == "reverse":
            inputs, labels = reverse.reverse_batch(
                c["vocab_size"], o.batch_size, c["bos_token_id"],
                c["eos_token_id"] if c["eos_token_id"] is not None else 2, c["pad_token_id"],
                generator)
            return data.Batch(inputs, labels, int(inputs["attention_mask"].sum()) * 2)
        return data.copy_batch(o.batch_size, o.copy_length, o.copy_symbols, c["bos_token_id"],
                               c["eos_token_id"] if c["eos_token_id"] is not None else 2,
                               generator)

    def files(self) -> dict[str, bytes]:
        """What the output folder gets at the start besides config.yaml: the tokenizer."""
        if self.options.task == "classify":
            folder = self.options.tokenizer_folder
            copied = tokenizer_files(folder) if folder is not None and folder.is_dir() else []
            if copied:
                return {path.name: path.read_bytes() for path in copied}
        if self.options.task in ("lm", "mlm", "classify"):
            return {BYTE_TOKENIZER: ByteTokenizer().to_json().encode()}
        if self.options.task == "reverse":  # so `zoo run OUT --text "..."` reverses words
            vocabulary = reverse.vocabulary(self.card["vocab_size"])
            return {WORD_TOKENIZER: vocabulary.to_json().encode()}
        return {}

    def evaluate(self, model: nn.Module) -> dict[str, Any] | None:
        """Scores on the held-out rows (classify with --eval or --eval-fraction), else None."""
        if self.labelled is None or self.labelled.eval is None:
            return None
        return classify.evaluate(model, self.labelled, self.card["pad_token_id"])

    def loss(self, model: nn.Module, batch: data.Batch) -> torch.Tensor:
        if self.options.task == "classify":
            logits = model(batch.inputs["input_ids"], batch.inputs["attention_mask"])["logits"]
            return F.cross_entropy(logits, batch.labels,
                                   label_smoothing=self.options.label_smoothing)
        if self.options.task == "lm":
            logits = model(batch.inputs["input_ids"])[0]
        elif self.options.task == "mlm":
            logits = model(batch.inputs["input_ids"])["logits"]
        else:
            logits = model(batch.inputs["input_ids"], batch.inputs["decoder_input_ids"],
                           batch.inputs.get("attention_mask"))
        return F.cross_entropy(logits.flatten(0, 1), batch.labels.flatten(),
                               ignore_index=data.IGNORE,
                               label_smoothing=self.options.label_smoothing)


def _distributed() -> tuple[int, int]:
    """(rank, world size); starts the process group when launched by torchrun."""
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
          files: dict[str, bytes] | None = None) -> dict[str, Any]:
    """Train `model` in place; returns the final trainer state (step, losses, ...).

    `files` are written into OUT at the start (classify: init.json). With held-out rows
    (classify), each checkpoint step is evaluated (`evaluated(step, scores)`, and the scores
    in metrics.jsonl) and the last evaluation is OUT/eval.json. `--force` over an existing
    OUT trains into a staged folder that replaces OUT only once training is done: a failed or
    interrupted run leaves the old OUT as it was."""
    _check_fit(card, options)  # first: the defaults depend on a known task
    options = options.resolved(card)
    rank, world = _distributed()
    with output_lock(options.out) if rank == 0 else contextlib.nullcontext():
        if rank == 0 and options.force and not options.resume and options.out.exists():
            with atomic_folder(options.out, force=True) as staging:
                return _train(model, card, replace(options, out=staging), rank, world,
                              progress, log_every, evaluated, files, shown=options.out)
        return _train(model, card, options, rank, world, progress, log_every, evaluated,
                      files, shown=options.out)


def _train(model: nn.Module, card: Card, options: TrainOptions, rank: int, world: int,
           progress: Progress, log_every: int, evaluated: Evaluated,
           files: dict[str, bytes] | None, shown: Path) -> dict[str, Any]:
    """The loop, writing into `options.out` (OUT, or its staged replacement); messages name
    `shown`, the OUT the user asked for."""
    writer = rank == 0
    task = Task(card, options)
    checkpoint = _prepare_out(card, options, writer)
    optimizer = torch.optim.Adam(model.parameters(), lr=options.lr, betas=(0.9, 0.98), eps=1e-9)
    start, losses = 0, []
    if checkpoint is not None:
        restore(checkpoint, model, optimizer)
        start, losses = checkpoint.step, checkpoint.trainer["losses"]
    scheduler = make_scheduler(optimizer, options.schedule, card["d_model"], options.warmup,
                               options.steps)
    with warnings.catch_warnings():  # fast-forwarding, so no optimizer.step() comes first
        warnings.filterwarnings("ignore", message="Detected call of `lr_scheduler.step")
        for _ in range(start):  # the schedule is a pure function of the step
            scheduler.step()
    if writer:
        options.out.mkdir(parents=True, exist_ok=True)
        truncate_metrics(options.out, start)  # a resumed run logs its steps once
        atomic_write_bytes(options.out / CONFIG, card_yaml(card).encode())
        for name, content in {**task.files(), **(files or {})}.items():
            atomic_write_bytes(options.out / name, content)
    trained = nn.parallel.DistributedDataParallel(model) if world > 1 else model
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
        if not math.isfinite(loss.item()):
            last = latest_checkpoint(options.out)
            if options.out != shown:  # staged under --force: the old OUT stays
                kept = f"{display_path(shown)} left as it was"
            elif last:
                kept = f"last good checkpoint: step {last.step} in {display_path(shown)}"
            else:
                kept = f"no checkpoint yet in {display_path(shown)}"
            raise TrainingError(f"step {step + 1}: loss is {loss.item()}; stopped ({kept})")
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
            record = {"step": done, "loss": loss.item(), "lr": lr, "tokens_per_s": rate}
            if scores:
                record |= {"eval_accuracy": scores["accuracy"],
                           "eval_macro_f1": scores["macro_f1"]}
            append_metrics(options.out, record)
            progress(done, options.steps, loss.item(), lr, rate)
            if scores:
                evaluated(done, scores)
        if checkpoint_step:
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
    if world > 1:
        dist.barrier()
        dist.destroy_process_group()
    return final
