"""The zoo against its peers on the same weights, in one run: Hugging Face PyTorch, Optimum's
ONNX export, ONNX Runtime GenAI, and the zoo's exports, every ONNX graph in a plain session
(default SessionOptions, as an embedder opens it).

    benchmarks/setup.sh                                  # once: benchmarks/.venv
    benchmarks/.venv/bin/python benchmarks/peers.py --json peers.json

Rows: bert-base forward at batch 1 and 8 x 128; gpt2-small prefill (batch 1 x 32, 1 x 512,
4 x 32: each graph's first call, and the first call of the zoo's `generate`) and greedy
decoding (prompt 32, 64 new tokens). Engines are timed interleaved (one run of each per
round), so the shared machine's drifting load weighs on all alike; the ratios are the result.
Outputs are checked first: encoder logits within 1e-4 of PyTorch, the same greedy tokens from
every engine, the same next token from every prefill.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from collections.abc import Callable
from importlib.metadata import version
from pathlib import Path

import numpy as np
import onnxruntime as ort
import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))

from prepare import hf_folder, optimum_export, zoo_export  # noqa: E402

from export.bench.genai_vs_zoo import genai_runner, zoo_runner  # noqa: E402
from export.bench.machine import cpu_name  # noqa: E402
from export.cpu import cpu_flags  # noqa: E402
from export.opening import open_export  # noqa: E402
from runtime.contract import MODEL_GRAPH  # noqa: E402
from runtime.generate import open_session  # noqa: E402
from runtime.sessions import Runtime  # noqa: E402

Run = Callable[[], object]
FIRST_CALL = "zoo generate's first call (model_kv.onnx)"
PACKAGES = ("torch", "transformers", "optimum-onnx", "onnxruntime", "onnxruntime-genai")


# Before each timed run: the engine that ran before leaves its threads spinning for a while
# (ONNX Runtime's intra-op pool, PyTorch's OpenMP), and back to back they slowed the next
# engine by up to 1.5x (gpt2-small 1x32: 152 ms back to back, 95-113 ms after a pause).
PAUSE_S = 0.05


def interleaved(runs: dict[str, Run], rounds: int,
                warm_up: bool = True) -> dict[str, dict[str, float]]:
    """Median, p10 and p90 seconds per engine, after one warm-up run each (unless the caller
    has just run each, e.g. to check its output). Each round starts one engine later, so no
    engine always follows the same one."""
    for run in runs.values() if warm_up else ():
        run()
    times: dict[str, list[float]] = {name: [] for name in runs}
    names = list(runs)
    for index in range(rounds):
        shift = index % len(names)
        for name in names[shift:] + names[:shift]:
            time.sleep(PAUSE_S)
            start = time.perf_counter()
            runs[name]()
            times[name].append(time.perf_counter() - start)
    return {name: {"median": statistics.median(values),
                   "p10": float(np.percentile(values, 10)),
                   "p90": float(np.percentile(values, 90))} for name, values in times.items()}


def plain_session(path: Path) -> ort.InferenceSession:
    return ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])


def bert_rows(work: Path, rounds: int) -> list[dict]:
    from transformers import BertForMaskedLM

    hf = BertForMaskedLM.from_pretrained(hf_folder("bert-base", work)).eval()
    graphs = {"optimum": optimum_export("bert-base", work) / "model.onnx",
              "zoo": zoo_export("bert-base", work, optimize=False) / MODEL_GRAPH}
    before = work / "before-bert-base-default" / "model.onnx"  # the zoo before issue #14
    if before.exists():
        graphs["zoo before #14"] = before
    sessions = {name: plain_session(path) for name, path in graphs.items()}
    rows = []
    for batch in (1, 8):
        ids = np.random.default_rng(batch).integers(1000, 20000, (batch, 128)).astype(np.int64)
        feeds = {"input_ids": ids, "attention_mask": np.ones_like(ids),
                 "token_type_ids": np.zeros_like(ids)}
        with torch.no_grad():
            reference = hf(**{k: torch.from_numpy(v) for k, v in feeds.items()}).logits.numpy()
        runs: dict[str, Run] = {"hf-pytorch": lambda f=feeds: hf_forward(hf, f)}
        errors = {}
        for name, session in sessions.items():
            wanted = {i.name for i in session.get_inputs()}
            fed = {k: v for k, v in feeds.items() if k in wanted}
            logits = session.run(["logits"], fed)[0]
            errors[name] = float(np.abs(logits - reference).max())
            runs[name] = lambda s=session, f=fed: s.run(["logits"], f)
        timings = interleaved(runs, rounds)
        rows.append({"work": f"bert-base forward, batch {batch} x 128", "seconds": timings,
                     "max_abs_logit_error_vs_pytorch": errors})
    return rows


def hf_forward(model: torch.nn.Module, feeds: dict[str, np.ndarray]) -> object:
    with torch.no_grad():
        return model(**{k: torch.from_numpy(v) for k, v in feeds.items()}).logits


def decoder_feeds(session: ort.InferenceSession, ids: np.ndarray, past: list[np.ndarray] | None,
                  past_length: int) -> dict[str, np.ndarray]:
    """The contract's (and Optimum's) decoder inputs: ids, mask, positions, the cache."""
    batch, length = ids.shape
    feeds = {"input_ids": ids,
             "attention_mask": np.ones((batch, past_length + length), np.int64),
             "position_ids": np.arange(past_length, past_length + length,
                                       dtype=np.int64)[None].repeat(batch, 0)}
    names = [i for i in session.get_inputs() if i.name.startswith("past_key_values")]
    for index, spec in enumerate(names):
        if past is None:
            heads, head_dim = spec.shape[1], spec.shape[3]
            feeds[spec.name] = np.zeros((batch, heads, 0, head_dim), np.float32)
        else:
            feeds[spec.name] = past[index]
    return {k: v for k, v in feeds.items() if k in {i.name for i in session.get_inputs()}}


def plain_greedy(session: ort.InferenceSession, prompt: list[int], new_tokens: int) -> list[int]:
    """The loop a new user writes: numpy in, the cache handed back each step."""
    ids = np.array([prompt], np.int64)
    past, length, out = None, 0, []
    for _ in range(new_tokens):
        results = session.run(None, decoder_feeds(session, ids, past, length))
        token = int(results[0][0, -1].argmax())
        out.append(token)
        length += ids.shape[1]
        past, ids = results[1:], np.array([[token]], np.int64)
    return out


def gpt2_rows(work: Path, rounds: int, prompt_length: int, new_tokens: int) -> list[dict]:
    from transformers import GPT2LMHeadModel

    hf = GPT2LMHeadModel.from_pretrained(hf_folder("gpt2-small", work)).eval()
    optimum = optimum_export("gpt2-small", work)
    default, optimized = (zoo_export("gpt2-small", work, optimize=flag) for flag in (False, True))
    if not (optimum / "genai_config.json").exists():  # same input names as the contract
        config = json.loads((default / "genai_config.json").read_text())
        config["model"]["decoder"]["filename"] = "model.onnx"  # Optimum's graph is at the top
        (optimum / "genai_config.json").write_text(json.dumps(config, indent=2))
    sessions = {"optimum": plain_session(optimum / "model.onnx"),
                "zoo": plain_session(default / MODEL_GRAPH),
                "zoo --optimize": plain_session(optimized / MODEL_GRAPH)}
    rows = prefill_rows(hf, sessions, open_export(optimized), rounds, new_tokens)
    prompt = [int(i) for i in np.random.default_rng(0).integers(3, 50000, prompt_length)]
    runs = {
        "hf-pytorch generate": lambda: hf_greedy(hf, prompt, new_tokens),
        "optimum plain loop": lambda: plain_greedy(sessions["optimum"], prompt, new_tokens),
        "genai on optimum's graph": genai_runner(optimum, prompt, new_tokens),
        "zoo plain loop": lambda: plain_greedy(sessions["zoo"], prompt, new_tokens),
        "genai on zoo --optimize": genai_runner(optimized, prompt, new_tokens),
        "zoo generate (--optimize)": zoo_runner(optimized, prompt, new_tokens),
    }
    tokens = {name: list(run()) for name, run in runs.items()}
    agree = {name: seq == tokens["hf-pytorch generate"] for name, seq in tokens.items()}
    timings = interleaved(runs, max(1, rounds // 3))
    rows.append({"work": f"gpt2-small greedy, {prompt_length} + {new_tokens} tokens",
                 "seconds": timings, "same_tokens_as_pytorch": agree,
                 "tokens_per_second": {name: new_tokens / t["median"]
                                       for name, t in timings.items()}})
    return rows


def prefill_rows(hf: torch.nn.Module, sessions: dict[str, ort.InferenceSession],
                 optimized: Runtime, rounds: int, new_tokens: int) -> list[dict]:
    """Each graph's first call on a prompt, and what `generate` runs first: the shared-cache
    graph, whose logits are the last token's only (the contract graph and Optimum's return
    every position's). Its sessions close on return, before the greedy rows."""
    rows = []
    for batch, length in ((1, 32), (1, 512), (4, 32)):
        ids = np.random.default_rng(length).integers(3, 50000, (batch, length)).astype(np.int64)
        runs: dict[str, Run] = {"hf-pytorch": lambda i=ids: hf_prefill(hf, i)}
        next_tokens = {}
        for name, session in sessions.items():
            feeds = decoder_feeds(session, ids, None, 0)
            runs[name] = lambda s=session, f=feeds: s.run(["logits"], f)
            next_tokens[name] = session.run(["logits"], feeds)[0][:, -1].argmax(-1).tolist()
        first_call = open_session(optimized, capacity=length + new_tokens)
        runs[FIRST_CALL] = lambda s=first_call, i=ids: s.prefill(i, None)
        next_tokens[FIRST_CALL] = first_call.prefill(ids, None).argmax(-1).tolist()
        rows.append({"work": f"gpt2-small prefill, batch {batch} x {length}",
                     "seconds": interleaved(runs, rounds),
                     "same_next_tokens_as_optimum": {
                         name: tokens == next_tokens["optimum"]
                         for name, tokens in next_tokens.items()}})
    return rows


def hf_prefill(model: torch.nn.Module, ids: np.ndarray) -> object:
    with torch.no_grad():
        return model(torch.from_numpy(ids), use_cache=True).logits


def hf_greedy(model: torch.nn.Module, prompt: list[int], new_tokens: int) -> list[int]:
    with torch.no_grad():
        out = model.generate(torch.tensor([prompt]), max_new_tokens=new_tokens,
                             min_new_tokens=new_tokens, do_sample=False, pad_token_id=0)
    return out[0, len(prompt):].tolist()


def machine() -> dict:
    return {"cpu": cpu_name(), "flags": cpu_flags(),
            "cores": os.cpu_count(), "load_1min": os.getloadavg()[0],
            "versions": {name: version(name) for name in PACKAGES}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--work", type=Path, default=HERE / "work",
                        help="where the weights and exports are made (and reused)")
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--prompt", type=int, default=32)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--only", choices=("bert", "gpt2"))
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    args.work.mkdir(parents=True, exist_ok=True)
    report = {"before": machine(), "rows": []}
    print(json.dumps(report["before"]), flush=True)
    if args.only in (None, "bert"):
        report["rows"] += bert_rows(args.work, args.rounds)
    if args.only in (None, "gpt2"):
        report["rows"] += gpt2_rows(args.work, args.rounds, args.prompt, args.tokens)
    report["after"] = machine()
    print_report(report, args.json)


def print_report(report: dict, path: Path | None) -> None:
    """Each row as a JSON line, the load after, and the whole report to `path` if given."""
    for row in report["rows"]:
        print(json.dumps(row), flush=True)
    print(json.dumps({"load_1min_after": report["after"]["load_1min"]}))
    if path:
        path.write_text(json.dumps(report, indent=1), encoding="utf-8")


if __name__ == "__main__":
    main()
