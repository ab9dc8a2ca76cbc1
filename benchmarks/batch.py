"""A batch of users (issue #14, point 3): gpt2-small, 16 prompts of 8..256 tokens (fixed seed),
64 new greedy tokens each; the zoo's generate() and Hugging Face's batched `generate` (both
left-padded) against ONNX Runtime GenAI's batched loop (padded on the right: GenAI reads leading
pad ids as tokens), on the same random weights, in one run.

    benchmarks/.venv/bin/python benchmarks/batch.py --json batch.json

Two cases. "no eos": random weights never reach an end token, so every row runs 64 tokens
(each engine is told so). "early eos": the end token is set to a token that greedy decoding
of these prompts reaches early in some rows and never in others (chosen from the one-at-a-time
run, printed), so finished rows stop costing the zoo work while the others go on. Engines are
timed interleaved; aggregate tokens/s counts each row's tokens up to and including its eos.
Tokens are checked first against the zoo generating each prompt alone (no padding).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np
import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))

from peers import Run, interleaved, machine  # noqa: E402
from prepare import hf_folder, zoo_export  # noqa: E402

from export.opening import open_export  # noqa: E402
from export.targets.genai import genai_batch  # noqa: E402
from runtime.generate import generate, left_padded  # noqa: E402

PAD = 0  # the zoo's and HF's left padding (not among the prompts' ids, 3..49999)
USERS, SHORTEST, LONGEST = 16, 8, 256


def prompts(seed: int) -> list[list[int]]:
    rng = np.random.default_rng(seed)
    lengths = [SHORTEST, LONGEST, *rng.integers(SHORTEST, LONGEST + 1, USERS - 2).tolist()]
    return [rng.integers(3, 50000, n).tolist() for n in lengths]


def until_eos(rows: list[list[int]], eos: int | None) -> list[list[int]]:
    """Each row cut after its first eos: what the user asked for, whatever each engine pads."""
    return [row[: row.index(eos) + 1] if eos is not None and eos in row else row for row in rows]


def early_eos(alone: list[list[int]], new_tokens: int) -> int:
    """The token that ends the most rows in their first half while leaving one row running."""
    def ended(token: int) -> int:
        return sum(token in row[: new_tokens // 2] for row in alone)
    candidates = [t for t in {t for row in alone for t in row} if any(t not in r for r in alone)]
    return max(sorted(candidates), key=ended)


def hf_batched(model: torch.nn.Module, ids: np.ndarray, mask: np.ndarray, new_tokens: int,
               eos: int | None) -> list[list[int]]:
    """HF batched `generate`, left padding: finished rows keep being computed (padded)."""
    with torch.no_grad():
        out = model.generate(torch.from_numpy(ids), attention_mask=torch.from_numpy(mask),
                             max_new_tokens=new_tokens, do_sample=False, pad_token_id=PAD,
                             eos_token_id=eos,
                             min_new_tokens=new_tokens if eos is None else None)
    return out[:, ids.shape[1]:].tolist()


def genai_folder(optimized: Path, eos: int | None, work: Path) -> Path:
    """The --optimize export as GenAI reads it; its eos set to the case's (a folder of links
    and an edited genai_config.json, so the graphs are not copied)."""
    if eos is None:
        return optimized
    folder = work / f"genai-eos-{eos}"
    folder.mkdir(exist_ok=True)
    for path in optimized.iterdir():
        if path.name != "genai_config.json" and not (folder / path.name).exists():
            (folder / path.name).symlink_to(path.resolve())
    config = json.loads((optimized / "genai_config.json").read_text())
    config["model"]["eos_token_id"] = eos
    (folder / "genai_config.json").write_text(json.dumps(config))
    return folder


def genai_batched(folder: Path, batch: list[list[int]], new_tokens: int, eos: int | None) -> Run:
    """GenAI's loop on the prompts padded as it masks padding (`genai_batch`): on the right,
    with its config's pad_token_id (gpt2's 50256). Left-padded with PAD, it read the pads as
    tokens and 15 of 16 rows were wrong."""
    import onnxruntime_genai as og

    model = og.Model(str(folder))
    ids = genai_batch(folder, batch)

    def run() -> list[list[int]]:
        params = og.GeneratorParams(model)
        length = ids.shape[1] + new_tokens
        params.set_search_options(max_length=length, do_sample=False, batch_size=len(ids),
                                  **({"min_length": length} if eos is None else {}))
        generator = og.Generator(model, params)
        generator.append_tokens(ids)
        while not generator.is_done():
            generator.generate_next_token()
        return [generator.get_sequence(row)[ids.shape[1]:].tolist() for row in range(len(ids))]

    return run


def case(name: str, eos: int | None, runs: dict[str, Run], alone: list[list[int]],
         rounds: int) -> dict:
    expected = until_eos(alone, eos)
    got = {engine: until_eos([list(map(int, r)) for r in run()], eos)
           for engine, run in runs.items()}  # also the warm-up
    same = {engine: sum(a == b for a, b in zip(rows, expected, strict=True))
            for engine, rows in got.items()}
    tokens = {engine: sum(map(len, rows)) for engine, rows in got.items()}
    timings = interleaved(runs, rounds, warm_up=False)
    return {"work": f"gpt2-small, {USERS} prompts {SHORTEST}..{LONGEST}, {name}",
            "eos": eos, "rows_ended_early": sum(len(r) < len(alone[0]) for r in expected),
            "seconds": timings, "tokens": tokens,
            "rows_same_as_alone": {engine: f"{n}/{USERS}" for engine, n in same.items()},
            "tokens_per_second": {engine: tokens[engine] / t["median"]
                                  for engine, t in timings.items()}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--work", type=Path, default=HERE / "work")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--no-genai", action="store_true")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    args.work.mkdir(parents=True, exist_ok=True)
    from transformers import GPT2LMHeadModel

    report = {"before": machine(), "rows": []}
    print(json.dumps(report["before"]), flush=True)
    hf = GPT2LMHeadModel.from_pretrained(hf_folder("gpt2-small", args.work)).eval()
    optimized = zoo_export("gpt2-small", args.work, optimize=True)
    runtime = open_export(optimized)
    batch = prompts(args.seed)
    ids, mask = left_padded(batch, PAD)
    alone = [generate(runtime, np.array([p]), None, args.tokens)[0].tolist() for p in batch]
    for name, eos in (("no eos", None), ("early eos", early_eos(alone, args.tokens))):
        runs: dict[str, Run] = {
            "hf-pytorch batched generate": lambda e=eos: hf_batched(hf, ids, mask, args.tokens, e),
            "zoo generate (--optimize)":
                lambda e=eos: generate(runtime, ids, mask, args.tokens, eos=e).tolist()}
        if not args.no_genai:
            folder = genai_folder(optimized, eos, args.work)
            runs["genai batched loop"] = genai_batched(folder, batch, args.tokens, eos)
        report["rows"].append(case(name, eos, runs, alone, args.rounds))
        print(json.dumps(report["rows"][-1]), flush=True)
    report["after"] = machine()
    print(json.dumps({"load_1min_after": report["after"]["load_1min"]}))
    if args.json:
        args.json.write_text(json.dumps(report, indent=1), encoding="utf-8")


if __name__ == "__main__":
    main()
