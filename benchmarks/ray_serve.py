"""`zoo serve` on Ray Serve (issue 48): output tokens/s at 16 and 32 users streaming at once,
plain `zoo serve` beside `zoo serve --ray` with 1 and with 2 replicas, on the same export and
machine in one run. On one machine the point is the cost of Ray's proxy and router (a request
crosses two more processes: the proxy, then the replica); the goal is one replica at most 10%
below plain `zoo serve`. Two replicas on two cores split the cores (--threads 1 each), so they
show the router's spreading, not more compute.

    .venv/bin/python benchmarks/ray_serve.py --export OUT --json ray-serve.json

The load is serve_bench.py's (its users, chat questions and stream reading): each user sends
requests one after another from a shared list, greedy, --tokens at most, streamed; tokens are
the usage's completion tokens, over the round's wall time. Every server: --max-batch 32,
--prefix-cache-mb 0 (as serve_bench.py), --threads as the table says. Settings alternate
within each round (plain, Ray 1, Ray 2 are all up at once, on their own ports) so a change in
the machine's load falls on all three; --rounds rounds, the best round of each kept. Needs the
`ray` extra."""

from __future__ import annotations

import argparse
import http.client
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))

from serve_bench import (  # noqa: E402
    QUESTIONS,
    Stream,
    chat_body,
    machine,
    run_users,
    summary,
)

ROOT = HERE.parent
ZOO = [sys.executable, "-c", "import cli; cli.main()"]  # this checkout's code
SETTINGS = {"plain": [], "ray-1": ["--ray", "--replicas", "1"],
            "ray-2": ["--ray", "--replicas", "2"]}


def say(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


class Started:
    """`zoo serve EXPORT --name m` with `flags` on a free port, in its own session (with the
    Ray it starts), ready when /health and then a chat request answer."""

    def __init__(self, folder: Path, flags: list[str], threads: int, log: Path) -> None:
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            self.port = probe.getsockname()[1]
        command = [*ZOO, "serve", str(folder), "--name", "m", "--port", str(self.port),
                   "--max-batch", "32", "--prefix-cache-mb", "0", "--threads", str(threads),
                   *flags]
        self.process = subprocess.Popen(command, cwd=ROOT, stdout=log.open("wb"),
                                        stderr=subprocess.STDOUT, start_new_session=True)
        self.log = log
        deadline = time.monotonic() + 600
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise SystemExit(f"zoo serve exited: {log.read_text()[-2000:]}")
            try:
                connection = http.client.HTTPConnection("127.0.0.1", self.port, timeout=10)
                connection.request("GET", "/health")
                if connection.getresponse().status == 200:
                    Stream(self.port, "/v1/chat/completions", chat_body(QUESTIONS[0], False, 4))
                    return  # a warm-up answered (every replica warms up in the first round)
            except OSError:
                pass
            time.sleep(1)
        raise SystemExit(f"zoo serve did not start: {log.read_text()[-2000:]}")

    def stop(self) -> None:
        self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(timeout=120)
        finally:
            try:
                os.killpg(self.process.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--export", type=Path, required=True)
    parser.add_argument("--users", type=int, nargs="+", default=[16, 32])
    parser.add_argument("--tokens", type=int, default=32, help="max_tokens of each request")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--work", type=Path, default=HERE / "work")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    args.work.mkdir(parents=True, exist_ok=True)
    cores = os.cpu_count() or 1
    threads = {"plain": cores, "ray-1": cores, "ray-2": max(cores // 2, 1)}
    report: dict[str, Any] = {"machine": machine(), "export": str(args.export),
                              "tokens": args.tokens, "threads": threads, "results": []}
    print(json.dumps(report["machine"]), flush=True)
    servers: dict[str, Started] = {}
    try:
        for name, flags in SETTINGS.items():  # one at a time: Ray's start takes the cores
            say(f"starting {name}...")
            servers[name] = Started(args.export, flags, threads[name],
                                    args.work / f"ray-serve-{name}.log")
        for users in args.users:
            bodies = [chat_body(QUESTIONS[i % len(QUESTIONS)], False, args.tokens)
                      for i in range(2 * users)]
            best: dict[str, dict[str, Any]] = {}
            for round_ in range(args.rounds):
                for name, server in servers.items():
                    say(f"{users} users, {name}, round {round_ + 1}...")
                    result = summary(*run_users(server.port, "/v1/chat/completions", bodies,
                                                users))
                    kept = best.get(name)
                    if kept is None or result["output_tokens_per_second"] > \
                            kept["output_tokens_per_second"]:
                        best[name] = result
            plain = best["plain"]["output_tokens_per_second"]
            for name, result in best.items():
                row = {"users": users, "setting": name, "threads": threads[name],
                       "ratio_to_plain": round(result["output_tokens_per_second"] / plain, 3),
                       **result}
                report["results"].append(row)
                print(json.dumps(row), flush=True)
    finally:
        for server in servers.values():
            server.stop()
    report["machine"]["load_1min_after"] = os.getloadavg()[0]
    if args.json:
        args.json.write_text(json.dumps(report, indent=1) + "\n")
    print(table(report))


def table(report: dict[str, Any]) -> str:
    lines = ["| users | setting | threads a replica | tokens/s | vs plain | TTFT p50 ms | "
             "e2e p50 ms |", "| --- | --- | --- | --- | --- | --- | --- |"]
    for row in report["results"]:
        lines.append(f"| {row['users']} | {row['setting']} | {row['threads']} | "
                     f"{row['output_tokens_per_second']} | {row['ratio_to_plain']} | "
                     f"{row['ttft_ms']['p50']} | {row['e2e_ms']['p50']} |")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
