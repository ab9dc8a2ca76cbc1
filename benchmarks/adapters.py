"""LoRA adapters kept apart (issue 46): what `zoo serve`'s continuous batching decodes per second
on an `--adapters keep` export (each adapted linear's factors fed as inputs) against the merged
export of the same model, side by side in one run.

    benchmarks/.venv/bin/python benchmarks/adapters.py --json adapters.json
    benchmarks/.venv/bin/python benchmarks/adapters.py --card llama-tiny --tokens 16  # quick

The card is built with seed 0 and given LoRA adapters (PEFT's default targets for Llama, q and
v, rank 8); the first adapter is saved as `zoo train --lora` saves one and exported twice,
merged (`--adapters merge`) and kept (`--adapters keep`), made once under --work; three more
adapters (other seeds, ranks 4 to 16) are written as the keep export writes its own. Three
loads, each --users requests decoding together in the scheduler (no HTTP: the batching loop
alone, max batch = users), every request a prompt of --prompt random ids and --tokens greedy
tokens (random weights seldom reach eos; the count is the tokens each got):

    merged         the merged export, every row the same weights
    kept, none     the kept export, every row without adapter (zero factors of rank 1)
    kept, 4 mixed  the kept export, rows spread over the 4 adapters (factors stacked per row)

The rounds are interleaved --rounds times and the best of each kept. The machine's CPU flags
and load are printed first, as the other benchmarks print them.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from serve import machine, say  # noqa: E402  (benchmarks/serve.py)

from runtime.opening import open_export  # noqa: E402
from runtime.sampling import Sampling  # noqa: E402
from runtime.serve.scheduler import Job, Scheduler  # noqa: E402

ROOT = HERE.parent
ZOO = [sys.executable, "-c", "import cli; cli.main()"]  # this checkout's zoo
TARGETS = ("query", "value")
RANKS = (8, 4, 16, 8)  # the exported adapter's, then the three others'


def adapted(card_name: str, seed: int, rank: int):  # noqa: ANN201 - a torch module
    import torch

    from registry.catalog import open_catalog
    from zoo.assemble import build_model
    from zoo.blocks.lora import adapters, add_adapters

    card = open_catalog(()).get(card_name)
    model = build_model(card, seed=0)
    add_adapters(model, TARGETS, rank, alpha=2.0 * rank)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for layer in adapters(model).values():
            layer.lora_B.weight.copy_(0.02 * torch.randn(layer.lora_B.weight.shape,
                                                         generator=generator))
    return model, card


def made(card_name: str, work: Path) -> tuple[Path, Path, dict[str, Path]]:
    """(the merged export, the kept export, {adapter name: its file}), made once."""
    from export.onnx.kept_adapters import adapter_parameters, write_adapter_file
    from zoo.files.peft_adapter import save_adapted
    from zoo.files.weights import CONFIG, card_yaml

    source = work / f"{card_name}-lora"
    if not (source / CONFIG).exists():
        model, card = adapted(card_name, 1, RANKS[0])
        source.mkdir(parents=True, exist_ok=True)
        save_adapted(model, card, source)
        (source / CONFIG).write_text(card_yaml(card), encoding="utf-8")
    exports = {}
    for how in ("merge", "keep"):
        out = exports[how] = work / f"{card_name}-{how}"
        if not (out / "manifest.json").exists():
            say(f"zoo export --onnx --adapters {how}...")
            subprocess.run([*ZOO, "export", str(source), "--onnx", "--adapters", how, "-o",
                            str(out), "--force"], cwd=ROOT, check=True)
    files = {source.name: exports["keep"] / f"adapters/{source.name}.onnx_adapter"}
    for seed, rank in enumerate(RANKS[1:], start=2):
        file = files[f"other{seed}"] = work / f"{card_name}-other{seed}.onnx_adapter"
        if not file.exists():
            write_adapter_file(adapter_parameters(adapted(card_name, seed, rank)[0]), file)
    return exports["merge"], exports["keep"], files


class Answer:
    """One request's last event, from the scheduler's thread."""

    def __init__(self) -> None:
        self.finished = threading.Event()
        self.tokens = -1

    def __call__(self, event: tuple) -> None:
        if event[0] in ("done", "gone", "error"):
            self.tokens = len(event[1].ids) if event[0] == "done" else -1
            self.finished.set()


def decoded(runtime, prompts: list[list[int]], adapters: list[str | None],  # noqa: ANN001
            tokens: int) -> tuple[float, int]:
    """(seconds, new tokens) of every prompt decoded together in one scheduler."""
    scheduler = Scheduler(runtime, len(prompts), lambda ids: "", "bench")
    answers = [Answer() for _ in prompts]
    start = time.perf_counter()
    with scheduler.wake:  # all queued before its thread takes any
        for prompt, adapter, answer in zip(prompts, adapters, answers, strict=True):
            scheduler.submit(Job(prompt, tokens, Sampling(), (), False, answer,
                                 adapter=adapter))
    for answer in answers:
        answer.finished.wait()
    seconds = time.perf_counter() - start
    if any(answer.tokens < 0 for answer in answers):
        raise SystemExit("a request failed")
    return seconds, sum(answer.tokens for answer in answers)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--card", default="smollm2-135m")
    parser.add_argument("--users", type=int, default=16)
    parser.add_argument("--prompt", type=int, default=16)
    parser.add_argument("--tokens", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--work", type=Path, default=HERE / "work")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    print(json.dumps(machine()))
    merged_folder, kept_folder, files = made(args.card, args.work)
    merged, kept = open_export(merged_folder), open_export(kept_folder)
    names = list(files)
    for name in names[1:]:
        kept.adapters.add(name, files[name])
    rng = np.random.default_rng(0)
    prompts = [rng.integers(3, 250, args.prompt).tolist() for _ in range(args.users)]
    loads = {
        "merged": (merged, [None] * args.users),
        "kept, none": (kept, [None] * args.users),
        "kept, 4 mixed": (kept, [names[row % len(names)] for row in range(args.users)]),
    }
    decoded(merged, prompts[:2], [None, None], 2)  # warm-up: sessions made, pages touched
    decoded(kept, prompts[:2], names[:2], 2)
    best: dict[str, float] = {}
    for round_ in range(args.rounds):
        for label, (runtime, adapters) in loads.items():
            seconds, made_tokens = decoded(runtime, prompts, adapters, args.tokens)
            rate = made_tokens / seconds
            say(f"round {round_ + 1} {label}: {made_tokens} tokens in {seconds:.2f} s, "
                f"{rate:.1f} tokens/s")
            best[label] = max(best.get(label, 0.0), rate)
    base = best["merged"]
    print(f"| load ({args.users} users, {args.tokens} tokens each) | tokens/s (best of "
          f"{args.rounds}) | vs merged |")
    print("| --- | ---: | ---: |")
    for label, rate in best.items():
        print(f"| {label} | {rate:.1f} | {rate / base:.2f}x |")
    if args.json:
        args.json.write_text(json.dumps({"machine": machine(), "card": args.card,
                                         "users": args.users, "tokens": args.tokens,
                                         "tokens_per_s": best}, indent=1) + "\n")


if __name__ == "__main__":
    main()
