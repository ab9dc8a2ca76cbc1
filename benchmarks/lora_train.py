"""LoRA training's cost (issue 46): trainable parameters, peak memory and steps/s of one
fine-tuning loop on SmolLM2-135M-Instruct, for the zoo's LoRA (r=8 on query,value), the zoo's
full fine-tuning, and PEFT's LoRA (r=8 on q_proj,v_proj) over transformers' LlamaForCausalLM
from the same GGUF file, on the same batches (--task chat's, from the city set), in one run.
`--interleaved` measures steps/s alone, the zoo's LoRA and PEFT's a step each in turn in one
process, so that a shared machine's load falls on both alike.

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/lora_train.py --folder smollm2 \\
        --gguf SmolLM2-135M-Instruct.Q4_1.gguf --data cities/train.jsonl --steps 6

Each configuration runs in a process of its own. Peak memory is the process's peak resident
set (VmHWM in /proc/self/status), reset (clear_refs 5) once the model is loaded, so it is the
training loop's own peak: weights, activations, gradients and Adam's moments; the resident set
after loading is shown beside it. Every loop is the same: forward, cross-entropy over the
assistant tokens, backward, clip at 1.0, Adam; steps/s leaves out the first step."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

CONFIGS = ("zoo-lora", "zoo-full", "peft-lora")


def _status(field: str) -> int:
    """A /proc/self/status field in bytes."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024
    raise KeyError(field)


def _model(config: str, folder: Path, gguf: Path):
    """(a callable from input ids to logits, the module whose parameters train)."""
    import torch

    if config.startswith("zoo"):
        from zoo.blocks.lora import add_adapters
        from zoo.files.sources import load_source

        model, _ = load_source(str(folder), (), 0)
        if config == "zoo-lora":
            add_adapters(model, ["query", "value"], 8, 8.0, 0.0, False, where=str(folder))
        return (lambda ids: model(ids)[0]), model
    import peft
    import transformers

    base = transformers.LlamaForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name,
                                                         torch_dtype=torch.float32)
    model = peft.get_peft_model(base, peft.LoraConfig(r=8, lora_alpha=8,
                                                      target_modules=["q_proj", "v_proj"]))
    return (lambda ids: model(input_ids=ids).logits), model


def _chat_task(folder: Path, data: Path, batch: int):
    """`--task chat`'s batches over the city set, as `zoo train` draws them."""
    from zoo.files.sources import load_source  # the card, for the batches
    from zoo.training.tasks import Task, TrainOptions

    options = TrainOptions(task="chat", data=data, out=Path("unused"), batch_size=batch,
                           tokenizer_folder=folder)
    card = load_source(str(folder), (), 0)[1]
    return Task(card, options.resolved(card))


def _stepper(config: str, folder: Path, gguf: Path):
    """(a function running one training step on a batch, returning (seconds, loss), the
    model, its trainable parameters)."""
    import torch
    import torch.nn.functional as F

    from zoo.training.data import IGNORE

    torch.manual_seed(0)
    forward, model = _model(config, folder, gguf)
    model.train()
    trainable = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.Adam(trainable, lr=2e-4, betas=(0.9, 0.98), eps=1e-9)

    def step(batch) -> tuple[float, float]:
        started = time.perf_counter()
        logits = forward(batch.inputs["input_ids"])
        loss = F.cross_entropy(logits.flatten(0, 1), batch.labels.flatten(),
                               ignore_index=IGNORE)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(trainable, 1.0)
        optimizer.step()
        return time.perf_counter() - started, loss.item()

    return step, model, trainable


def run(config: str, folder: Path, gguf: Path, data: Path, steps: int, batch: int) -> dict:
    step, model, trainable = _stepper(config, folder, gguf)
    loaded = _status("VmRSS")
    task = _chat_task(folder, data, batch)
    Path("/proc/self/clear_refs").write_text("5")  # the peak from here on
    times, losses = [], []
    for index in range(steps):
        seconds, loss = step(task.batch(index, 0))
        times.append(seconds)
        losses.append(round(loss, 4))
    return {"config": config, "trainable": sum(p.numel() for p in trainable),
            "total": sum(p.numel() for p in model.parameters()),
            "rss_loaded_mb": loaded / 2**20, "peak_training_mb": _status("VmHWM") / 2**20,
            "steps_per_s": (len(times) - 1) / sum(times[1:]), "losses": losses}


def interleaved(folder: Path, gguf: Path, data: Path, steps: int, batch: int) -> None:
    """Steps/s of the zoo's LoRA against PEFT's, alternating step by step (the first step of
    each left out), printed with their ratio."""
    from export.cpu import cpu_flags

    print(f"CPU flags: {' '.join(cpu_flags())}")
    task = _chat_task(folder, data, batch)
    steppers = {config: _stepper(config, folder, gguf)[0] for config in ("zoo-lora", "peft-lora")}
    seconds: dict[str, list[float]] = {config: [] for config in steppers}
    for index in range(steps):
        batch_ = task.batch(index, 0)
        for config, step in steppers.items():
            taken, loss = step(batch_)
            if index:
                seconds[config].append(taken)
            print(f"step {index + 1} {config}: {taken:.3f} s, loss {loss:.4f}", flush=True)
    rate = {config: len(times) / sum(times) for config, times in seconds.items()}
    for config, value in rate.items():
        print(f"{config:<10} {value:.3f} steps/s")
    print(f"zoo / PEFT: {rate['zoo-lora'] / rate['peft-lora']:.2f}x")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--folder", type=Path, required=True, help="zoo import of the GGUF")
    parser.add_argument("--gguf", type=Path, required=True)
    parser.add_argument("--data", type=Path, required=True, help="chat JSONL (zoo dataset cities)")
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--batch-size", type=int, default=4)
    parser.add_argument("--run", choices=CONFIGS, help=argparse.SUPPRESS)
    parser.add_argument("--interleaved", action="store_true",
                        help="steps/s only: the zoo's LoRA and PEFT's in one process, a step "
                        "of each in turn on the same batch (a shared machine's load falls on "
                        "both alike)")
    args = parser.parse_args()
    if args.interleaved:
        interleaved(args.folder, args.gguf, args.data, args.steps, args.batch_size)
        return
    if args.run:
        print(json.dumps(run(args.run, args.folder, args.gguf, args.data, args.steps,
                             args.batch_size)))
        return
    from export.cpu import cpu_flags

    print(f"CPU flags: {' '.join(cpu_flags())}")
    rows = []
    for config in CONFIGS:
        out = subprocess.run([sys.executable, __file__, "--run", config, *sys.argv[1:]],
                             capture_output=True, text=True, check=True)
        rows.append(json.loads(out.stdout.strip().splitlines()[-1]))
    print(f"{'config':<10} {'trainable':>12} {'of':>12} {'RSS loaded':>11} "
          f"{'peak (train)':>13} {'steps/s':>8}  losses")
    for row in rows:
        print(f"{row['config']:<10} {row['trainable']:>12,} {row['total']:>12,} "
              f"{row['rss_loaded_mb']:>9.0f}MB {row['peak_training_mb']:>11.0f}MB "
              f"{row['steps_per_s']:>8.3f}  {row['losses']}")


if __name__ == "__main__":
    main()
