"""llguidance against xgrammar on the decode loop (issue 45): the time to make each step's
token mask for the same JSON schema over SmolLM2's tokenizer (49,152 tokens), following the
same token sequence (a valid compact answer's tokens), side by side in one run.

    .venv/bin/python benchmarks/grammar_engines.py --export OUT --json grammar-engines.json

xgrammar is not one of the zoo's dependencies (runtime/grammar/engine.py says why); install it
apart, without touching the virtualenv's packages, and point PYTHONPATH at it:

    .venv/bin/pip install --no-deps -c constraints.txt --target benchmarks/work/xgrammar-site \
        xgrammar==0.2.9 apache-tvm-ffi==0.1.15.post2    # what installs with constraints.txt
    PYTHONPATH=benchmarks/work/xgrammar-site .venv/bin/python benchmarks/grammar_engines.py ...

(it needs torch and transformers, which the virtualenv has; triton, which pip would add, only
for GPU kernels). Both engines with the zoo's compact JSON (no whitespace, "," and ":"), the
schema of benchmarks/serve_bench.py. Per engine: the tokenizer's table (once per export), a
grammar's compile (per request; xgrammar's cache off), and per step the mask alone (a packed
bitmask of the vocabulary) and the mask as the decode loop uses it (llguidance: the zoo's
`Constraint.mask`, a copy of the logits with forbidden tokens at -inf; xgrammar: the bitmask
applied to the logits in place, its own CPU kernel), mean and p99 over --repeats passes of the
answer's tokens, the first step apart (where lazy work shows), 1 thread each."""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))

from serve_bench import SCHEMA  # noqa: E402

from export.bench.machine import cpu_name  # noqa: E402
from export.cpu import cpu_flags  # noqa: E402
from runtime.grammar.engine import JSON_OPTIONS, Constraint  # noqa: E402

ANSWER = {"topic": "Photosynthesis",
          "answer": "Photosynthesis is how green plants use sunlight, water and carbon dioxide "
                    "to make sugar and oxygen.",
          "confidence": 5}


def timed(call: Callable[[], Any]) -> tuple[float, Any]:
    start = time.perf_counter()
    value = call()
    return time.perf_counter() - start, value


def stats(seconds: list[float]) -> dict[str, float]:
    micro = np.asarray(seconds) * 1e6
    return {"mean_us": round(float(micro.mean()), 1),
            "p50_us": round(float(np.percentile(micro, 50)), 1),
            "p99_us": round(float(np.percentile(micro, 99)), 1)}


def follow(make: Callable[[], Any], steps: dict[str, Callable[[Any], Any]],
           accept: Callable[[Any, int], bool], tokens: list[int], repeats: int
           ) -> dict[str, Any]:
    """Each step kind's times over `repeats` fresh passes along `tokens`; the first step of
    each pass kept apart."""
    result: dict[str, Any] = {}
    for name, step in steps.items():
        first, rest, compiles = [], [], []
        for _ in range(repeats):
            seconds, state = timed(make)
            compiles.append(seconds)
            for index, token in enumerate(tokens):
                start = time.perf_counter()
                step(state)
                (rest if index else first).append(time.perf_counter() - start)
                assert accept(state, token), f"token {token} refused at step {index}"
        result[name] = {"first_step_us": stats(first)["p50_us"], **stats(rest)}
        result.setdefault("compile_ms", round(float(np.median(compiles)) * 1000, 2))
    return result


def llguidance_engine(folder: Path, vocab: int, eos: int, tokens: list[int], repeats: int
                      ) -> dict[str, Any]:
    import llguidance
    from llguidance.numpy import fill_next_token_bitmask
    from tokenizers import Tokenizer

    source = Tokenizer.from_file(str(folder / "tokenizer.json")).to_str()
    table_s, table = timed(lambda: llguidance.LLTokenizer(source, n_vocab=vocab, eos_token=eos))
    schema = json.dumps(SCHEMA)
    logits = np.random.default_rng(0).standard_normal(vocab).astype(np.float32)

    def make() -> Constraint:  # the grammar text and the matcher, as a request makes them
        text = llguidance.LLMatcher.grammar_from_json_schema(schema, overrides=JSON_OPTIONS)
        return Constraint(llguidance.LLMatcher(table, text, log_level=0), vocab)

    steps = {"bitmask": lambda c: fill_next_token_bitmask(c.matcher, c.bits),
             "decode loop (Constraint.mask)": lambda c: c.mask(logits)}
    return {"version": llguidance.__version__, "tokenizer_ms": round(table_s * 1000, 1),
            **follow(make, steps, lambda c, t: bool(c.matcher.consume_token(t)), tokens,
                     repeats)}


def xgrammar_engine(folder: Path, vocab: int, tokens: list[int], repeats: int
                    ) -> dict[str, Any]:
    import importlib.metadata

    import torch
    import xgrammar as xgr
    from transformers import AutoTokenizer

    torch.set_num_threads(1)
    hf = AutoTokenizer.from_pretrained(str(folder))
    table_s, info = timed(lambda: xgr.TokenizerInfo.from_huggingface(hf, vocab_size=vocab))
    compiler = xgr.GrammarCompiler(info, max_threads=1, cache_enabled=False)
    schema = json.dumps(SCHEMA)
    bits = xgr.allocate_token_bitmask(1, vocab)
    logits = torch.from_numpy(np.random.default_rng(0).standard_normal((1, vocab))
                              .astype(np.float32))

    def make() -> Any:
        compiled = compiler.compile_json_schema(schema, any_whitespace=False,
                                                separators=(",", ":"), strict_mode=True)
        return xgr.GrammarMatcher(compiled)

    def applied(matcher: Any) -> None:
        matcher.fill_next_token_bitmask(bits)
        xgr.apply_token_bitmask_inplace(logits.clone(), bits)  # the copy as the zoo's

    steps = {"bitmask": lambda m: m.fill_next_token_bitmask(bits),
             "decode loop (bitmask applied)": applied}
    return {"version": importlib.metadata.version("xgrammar"),
            "tokenizer_ms": round(table_s * 1000, 1),
            **follow(make, steps, lambda m, t: bool(m.accept_token(t)), tokens, repeats)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--export", type=Path, required=True, help="a SmolLM2 export")
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    os.environ.setdefault("RAYON_NUM_THREADS", "1")
    from tokenizers import Tokenizer

    card = json.loads((args.export / "config.json").read_text())
    vocab, eos = card["vocab_size"], card["eos_token_id"]
    text = json.dumps(ANSWER, separators=(",", ":"))
    tokens = Tokenizer.from_file(str(args.export / "tokenizer.json")).encode(
        text, add_special_tokens=False).ids
    report: dict[str, Any] = {
        "machine": {"cpu": cpu_name(), "cpu_flags": cpu_flags(), "cores": os.cpu_count(),
                    "load_1min": os.getloadavg()[0]},
        "vocab": vocab, "answer_tokens": len(tokens), "answer": text, "repeats": args.repeats}
    report["llguidance"] = llguidance_engine(args.export, vocab, eos, tokens, args.repeats)
    print(json.dumps({"llguidance": report["llguidance"]}), flush=True)
    try:
        report["xgrammar"] = xgrammar_engine(args.export, vocab, tokens, args.repeats)
    except ImportError as exc:
        report["xgrammar"] = {"skipped": f"{exc} (see this script's docstring)"}
    print(json.dumps({"xgrammar": report["xgrammar"]}), flush=True)
    report["load_1min_after"] = os.getloadavg()[0]
    if args.json:
        args.json.write_text(json.dumps(report, indent=1), encoding="utf-8")


if __name__ == "__main__":
    main()
