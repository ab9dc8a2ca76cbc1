"""Gemma 3 and a mixture of experts decoding against their peers, in one run (issue #34).

    make .venv/.installed          # once: the zoo, transformers 5, ONNX Runtime GenAI (+ builder)
    .venv/bin/python benchmarks/gemma_moe.py --json gemma_moe.json
    ... --layers 18 --rounds 5     # gemma-3-270m's full depth

Runs in the project's .venv: its transformers knows Gemma3ForCausalLM and Qwen3MoeForCausalLM,
and is the newest one GenAI's model builder needs (benchmarks/.venv-builder is used for the
builder where benchmarks/setup.sh made it). Every engine starts from the same Hugging Face
folder of random weights (seeded): transformers loads it, `zoo import` + `zoo export` (the
zoo's CLI, in a subprocess) and GenAI's builder export it. Greedy, batch 1, no early stop,
timed interleaved (peers.py's `interleaved`); every engine on --threads threads (ONNX Runtime's
intra-op pool, GenAI's session options, torch.set_num_threads).

1. gemma-3-270m's shape (the published config; --layers of its 18, 6 by default: one whole
   LLLLLG period), a prompt longer than its 512-token sliding window, --tokens new tokens:
   transformers' generate, the zoo's plain export (plain loop), --optimize (GroupQueryAttention
   with local_window_size, shared cache) and --optimize --quantize int4, run by `zoo run`'s
   generate; GenAI's builder fp32 and int4 in GenAI's loop (its 0.18 reads Gemma 3's rotary
   bases by transformers 4's names: LEGACY_GEMMA3 hands them over so; a builder that still
   fails is reported and skipped).
2. A Qwen3-MoE-shaped model scaled down (--moe-layers, --experts 64, 8 per token, d_model 1024,
   expert d_ff 256) and a dense Qwen3 of the same active size (one SwiGLU of d_ff 8 x 256):
   transformers, the zoo's plain export (every expert computed, weighted by a router weight
   that is zero outside the top 8) and --optimize (ONNX Runtime's MoE operator: the chosen
   experts only). Tokens/s, and each engine's ratio to the dense model under the same engine:
   near 1 means only the chosen experts' products were computed; the plain graph's ratio shows
   the cost of computing all of them.

Timing: each round runs each engine for 1 new token (the prefill and the first token) and then
for --tokens, back to back; tokens/s of the whole run, the first token's seconds, and decode
tokens/s from the rounds' differences. Agreement: how many of each engine's greedy tokens follow
transformers' (fp32) before the first difference; random weights make near-ties, so a flip
(an int4 export's at once) is a rounding, not a bug. BENCHMARKS.md has the figures.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from statistics import median

import numpy as np
import torch

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(HERE))

from peers import hf_greedy, interleaved  # noqa: E402
from smollm2 import same_steps, say  # noqa: E402

from export.bench.machine import cpu_name  # noqa: E402
from export.cpu import cpu_flags  # noqa: E402

Run = Callable[[int], list[int]]  # new tokens -> greedy tokens
SEED = 0
ZOO = Path(sys.executable).parent / "zoo"
BUILDER = HERE / ".venv-builder" / "bin" / "python"
# a module's distribution may be named for its build (onnxruntime-gpu, onnxruntime-genai-cuda)
PACKAGES = {"torch": ("torch",), "transformers": ("transformers",),
            "onnxruntime": ("onnxruntime", "onnxruntime-gpu"),
            "onnxruntime-genai": ("onnxruntime-genai", "onnxruntime-genai-cuda")}
# google/gemma-3-270m's config.json (268,098,176 parameters at 18 layers)
GEMMA_270M = {"vocab_size": 262144, "hidden_size": 640, "intermediate_size": 2048,
              "num_hidden_layers": 18, "num_attention_heads": 4, "num_key_value_heads": 1,
              "head_dim": 256, "max_position_embeddings": 32768, "rms_norm_eps": 1e-6,
              "sliding_window": 512, "query_pre_attn_scalar": 256,
              "hidden_activation": "gelu_pytorch_tanh", "tie_word_embeddings": True,
              "rope_parameters": {
                  "full_attention": {"rope_type": "default", "rope_theta": 1000000.0},
                  "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0}},
              "pad_token_id": 0, "bos_token_id": 2, "eos_token_id": 1}
PATTERN = ["sliding_attention"] * 5 + ["full_attention"]
# Qwen3-30B-A3B's layout (experts per token, expert d_ff's ratio to d_model) scaled to fit
MOE = {"vocab_size": 32768, "hidden_size": 1024, "num_attention_heads": 16,
       "num_key_value_heads": 4, "head_dim": 64, "max_position_embeddings": 4096,
       "rms_norm_eps": 1e-6, "rope_theta": 1000000.0, "tie_word_embeddings": False,
       "pad_token_id": 0, "bos_token_id": 2, "eos_token_id": 1}
EXPERTS = {"num_experts_per_tok": 8, "moe_intermediate_size": 256,
           "norm_topk_prob": True, "decoder_sparse_step": 1, "mlp_only_layers": []}
DENSE_FF = EXPERTS["num_experts_per_tok"] * EXPERTS["moe_intermediate_size"]
ZOO_KINDS = {"plain": (), "optimize": ("--optimize",),
             "int4": ("--optimize", "--quantize", "int4")}


def machine(threads: int) -> dict:
    def installed(names: tuple[str, ...]) -> str:
        for name in names:
            try:
                return f"{name}=={version(name)}"
            except PackageNotFoundError:
                continue
        return "absent"

    return {"cpu": cpu_name(), "flags": cpu_flags(), "cores": os.cpu_count(),
            "threads": threads, "load_1min": os.getloadavg()[0],
            "versions": {name: installed(names) for name, names in PACKAGES.items()}}


def hf_folder(folder: Path, make: Callable[[], torch.nn.Module]) -> Path:
    """A Hugging Face folder of `make()`'s random weights (seeded), made once."""
    if not (folder / "model.safetensors").exists():
        say(f"making {folder.name}...")
        torch.manual_seed(SEED)
        make().eval().save_pretrained(folder, safe_serialization=True)
    return folder


def gemma_folder(work: Path, layers: int) -> Path:
    from transformers import Gemma3ForCausalLM, Gemma3TextConfig

    config = {**GEMMA_270M, "num_hidden_layers": layers,
              "layer_types": [PATTERN[i % len(PATTERN)] for i in range(layers)]}
    return hf_folder(work / f"hf-gemma-3-270m-{layers}l",
                     lambda: Gemma3ForCausalLM(Gemma3TextConfig(**config)))


def moe_folders(work: Path, layers: int, experts: int) -> dict[str, Path]:
    """The mixture of experts, and the dense model of its active size."""
    from transformers import Qwen3Config, Qwen3ForCausalLM, Qwen3MoeConfig, Qwen3MoeForCausalLM

    shape = {**MOE, "num_hidden_layers": layers}
    return {"moe": hf_folder(work / f"hf-moe-{layers}l-{experts}e", lambda: Qwen3MoeForCausalLM(
                Qwen3MoeConfig(**shape, **EXPERTS, num_experts=experts,
                               intermediate_size=DENSE_FF))),
            "dense": hf_folder(work / f"hf-dense-{layers}l", lambda: Qwen3ForCausalLM(
                Qwen3Config(**shape, intermediate_size=DENSE_FF)))}


def zoo_exports(source: Path, kinds: tuple[str, ...]) -> dict[str, Path]:
    """`zoo import` of the folder, then `zoo export` of each kind (each passes the zoo's parity
    or agreement check to be written); made once, beside the source."""
    imported = source.with_name(source.name.replace("hf-", "zoo-", 1))
    if not (imported / "model.safetensors").exists():
        say(f"zoo import {source.name}...")
        zoo_cli("import", str(source), "-o", str(imported), "--force")
    outs = {}
    for kind in kinds:
        out = outs[kind] = imported.with_name(f"{imported.name}-{kind}")
        if not (out / "manifest.json").exists():
            say(f"zoo export {imported.name} {' '.join(ZOO_KINDS[kind])}...")
            zoo_cli("export", str(imported), "--onnx", "-o", str(out), "--force",
                    *ZOO_KINDS[kind])
    return outs


def zoo_cli(*args: str) -> None:
    result = subprocess.run([str(ZOO), *args], capture_output=True, text=True, check=False)
    if result.returncode:
        raise SystemExit(f"zoo {' '.join(args)}: {result.stdout}{result.stderr}")


# GenAI 0.18's builder reads Gemma 3's rotary bases as transformers 4 named them
# (rope_local_base_freq, and one flat rope_parameters); transformers 5's per-layer-kind
# rope_parameters stop it with KeyError 'rope_type'. Its config is handed over in that form,
# the same values (in the builder's own process; its Gemma 3 class alone is wrapped).
LEGACY_GEMMA3 = """
import runpy, sys
import onnxruntime_genai.models  # puts its folder on sys.path: the builder imports `builders`
from builders.gemma import Gemma3Model
init = Gemma3Model.__init__
def legacy(self, config, *args):
    rope = config.rope_parameters
    if "sliding_attention" in rope:
        config.rope_local_base_freq = rope["sliding_attention"]["rope_theta"]
        config.rope_parameters = rope["full_attention"]
    init(self, config, *args)
Gemma3Model.__init__ = legacy
sys.argv[0] = "builder"
runpy.run_module("onnxruntime_genai.models.builder", run_name="__main__")
"""


def builder_export(source: Path, precision: str) -> Path | str:
    """GenAI's model builder's CPU export of the folder, or the reason it made none."""
    out = source.with_name(source.name.replace("hf-", "builder-", 1) + f"-{precision}")
    if (out / "genai_config.json").exists():
        return out
    say(f"GenAI's model builder {source.name} {precision}...")
    python = BUILDER if BUILDER.exists() else Path(sys.executable)
    result = subprocess.run(
        [str(python), "-c", LEGACY_GEMMA3, "-i", str(source), "-o", str(out), "-p", precision,
         "-e", "cpu", "-c", str(source.parent / "builder-cache")],
        capture_output=True, text=True, check=False)
    if result.returncode or not (out / "genai_config.json").exists():
        lines = [line for line in (result.stderr + result.stdout).splitlines()
                 if "Error" in line or "error:" in line]
        return f"the builder failed (exit {result.returncode}): " + \
            (lines[-1] if lines else "no error line")
    return out


def genai_runner(folder: Path, prompt: list[int], threads: int) -> Run:
    """GenAI's own loop (as export/bench/genai_vs_zoo.py runs it), its sessions on `threads`."""
    import onnxruntime_genai as og

    config = og.Config(str(folder))
    config.overlay(json.dumps({"model": {"decoder": {"session_options": {
        "intra_op_num_threads": threads}}}}))
    model = og.Model(config)

    def run(new_tokens: int) -> list[int]:
        params = og.GeneratorParams(model)
        params.set_search_options(max_length=len(prompt) + new_tokens, do_sample=False,
                                  min_length=len(prompt) + new_tokens)  # no early eos
        generator = og.Generator(model, params)
        generator.append_tokens(np.array([prompt], np.int32))
        while not generator.is_done():
            generator.generate_next_token()
        return generator.get_sequence(0)[len(prompt):].tolist()

    return run


def zoo_runner(folder: Path, prompt: list[int], threads: int) -> Run:
    """`zoo run`'s load and generate (no eos: every run decodes new_tokens)."""
    from runtime.exported import load
    from runtime.generate import generate

    runtime = load(folder, threads=threads).runtime
    ids = np.array([prompt], np.int64)
    return lambda new_tokens: generate(runtime, ids, None, new_tokens).tolist()[0]


def transformers_runner(source: Path, prompt: list[int]) -> Run:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(source, dtype=torch.float32).eval()
    model.generation_config.eos_token_id = None  # random weights: no early stop
    return lambda new_tokens: hf_greedy(model, prompt, new_tokens)


def race(runs: dict[str, Run], rounds: int, new_tokens: int, reference: str) -> dict:
    """Tokens checked first (that run is each engine's warm-up), then timed interleaved: in each
    round each engine runs one token (the prompt's prefill and the first token) and then
    new_tokens, back to back, so a round's difference is new_tokens - 1 decoding steps under
    the same load."""
    say(f"checking tokens, then {len(runs)} engines x {rounds} rounds...")
    tokens = {name: list(run(new_tokens)) for name, run in runs.items()}
    for run in runs.values():
        run(1)
    times: dict[str, list[tuple[float, float]]] = {name: [] for name in runs}

    def paired(name: str, run: Run) -> Callable[[], None]:
        def timed() -> None:
            start = time.perf_counter()
            run(1)
            middle = time.perf_counter()
            run(new_tokens)
            times[name].append((middle - start, time.perf_counter() - middle))
        return timed

    interleaved({name: paired(name, run) for name, run in runs.items()}, rounds, warm_up=False)
    first = {name: median(a for a, _ in pairs) for name, pairs in times.items()}
    whole = {name: median(b for _, b in pairs) for name, pairs in times.items()}
    decode = {name: median(b - a for a, b in pairs) for name, pairs in times.items()}
    return {"tokens_per_s": {name: round(new_tokens / whole[name], 2) for name in runs},
            "first_token_s": {name: round(first[name], 3) for name in runs},
            "decode_tokens_per_s": {name: round((new_tokens - 1) / decode[name], 2)
                                    for name in runs},
            "steps_following_transformers": {name: same_steps(tokens[name], tokens[reference])
                                             for name in runs},
            "seconds_first_and_whole": times}


def gemma_rows(work: Path, args: argparse.Namespace) -> list[dict]:
    source = gemma_folder(work, args.layers)
    zoo = zoo_exports(source, tuple(ZOO_KINDS))
    rng = np.random.default_rng(SEED)
    prompt = [int(i) for i in rng.integers(3, GEMMA_270M["vocab_size"], args.prompt)]
    n, t = args.tokens, args.threads
    runs: dict[str, Run] = {"transformers generate": transformers_runner(source, prompt)}
    runs.update({f"zoo generate {kind}": zoo_runner(folder, prompt, t)
                 for kind, folder in zoo.items()})
    skipped = {}
    for precision in ("fp32", "int4"):
        built = builder_export(source, precision)
        if isinstance(built, str):
            print(f"genai builder {precision}: skipped: {built}", flush=True)
            skipped[f"genai builder {precision}"] = built
        else:
            runs[f"genai builder {precision}"] = genai_runner(built, prompt, t)
    row = race(runs, args.rounds, n, "transformers generate")
    speed = row["tokens_per_s"]
    ratios = {f"{name} / transformers": round(speed[name] / speed["transformers generate"], 2)
              for name in speed if name != "transformers generate"}
    for zoo_kind, peer in (("optimize", "fp32"), ("int4", "int4")):
        if f"genai builder {peer}" in speed:
            ratios[f"zoo {zoo_kind} / genai builder {peer}"] = round(
                speed[f"zoo generate {zoo_kind}"] / speed[f"genai builder {peer}"], 2)
    return [{"work": f"gemma-3-270m shape ({args.layers} of 18 layers), greedy, batch 1, "
                     f"prompt {args.prompt} (window {GEMMA_270M['sliding_window']}) + {n} new",
             **row, "ratios": ratios, "skipped": skipped}]


def moe_rows(work: Path, args: argparse.Namespace) -> list[dict]:
    sources = moe_folders(work, args.moe_layers, args.experts)
    rng = np.random.default_rng(SEED)
    prompt = [int(i) for i in rng.integers(3, MOE["vocab_size"], args.moe_prompt)]
    n, t = args.tokens, args.threads
    rows = []
    speeds = {}
    for model, source in sources.items():
        zoo = zoo_exports(source, ("plain", "optimize"))
        runs: dict[str, Run] = {"transformers generate": transformers_runner(source, prompt)}
        runs.update({f"zoo generate {kind}": zoo_runner(folder, prompt, t)
                     for kind, folder in zoo.items()})
        row = race(runs, args.rounds, n, "transformers generate")
        speeds[model] = row
        rows.append({"work": f"{model}: {args.moe_layers} layers, d_model {MOE['hidden_size']}, "
                             + (f"{args.experts} experts of d_ff "
                                f"{EXPERTS['moe_intermediate_size']}, "
                                f"{EXPERTS['num_experts_per_tok']} per token" if model == "moe"
                                else f"one SwiGLU of d_ff {DENSE_FF}")
                             + f"; greedy, batch 1, prompt {len(prompt)} + {n} new", **row})
    rows.append({"work": "mixture of experts / dense of the same active size (tokens/s ratio; "
                         "1 = only the chosen experts computed)",
                 **{f"moe_over_dense_{rate}": {
                     name: round(speeds["moe"][rate][name] / speeds["dense"][rate][name], 2)
                     for name in speeds["moe"][rate]}
                    for rate in ("tokens_per_s", "decode_tokens_per_s")}})
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--work", type=Path, default=HERE / "work",
                        help="where the weights and exports are made (and reused)")
    parser.add_argument("--layers", type=int, default=6,
                        help="gemma-3-270m's layers to build (18: the published depth)")
    parser.add_argument("--moe-layers", type=int, default=4)
    parser.add_argument("--experts", type=int, default=64,  # OLMoE's count
                        help="experts per layer of the mixture (8 chosen per token)")
    parser.add_argument("--prompt", type=int, default=600,
                        help="Gemma's prompt length (past its 512-token window)")
    parser.add_argument("--moe-prompt", type=int, default=32)
    parser.add_argument("--tokens", type=int, default=64, help="new tokens per run")
    parser.add_argument("--rounds", type=int, default=3, help="timed runs per engine")
    parser.add_argument("--threads", type=int, default=os.cpu_count(),
                        help="every engine's intra-op threads [all cores]")
    parser.add_argument("--only", choices=("gemma", "moe"))
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    args.work.mkdir(parents=True, exist_ok=True)
    torch.set_num_threads(args.threads)
    report = {"before": machine(args.threads), "rows": []}
    print(json.dumps(report["before"]), flush=True)
    start = time.perf_counter()
    parts = {"gemma": gemma_rows, "moe": moe_rows}
    for name, part in parts.items():
        if args.only in (None, name):
            for row in part(args.work, args):
                report["rows"].append(row)
                print(json.dumps({k: v for k, v in row.items() if not k.startswith("seconds")}),
                      flush=True)
    report["after"] = machine(args.threads)
    report["seconds"] = round(time.perf_counter() - start, 1)
    print(json.dumps({"load_1min_after": report["after"]["load_1min"],
                      "seconds": report["seconds"]}))
    if args.json:
        args.json.write_text(json.dumps(report, indent=1), encoding="utf-8")


if __name__ == "__main__":
    main()
