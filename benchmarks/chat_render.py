"""What the memory bound costs a chat request (issue 43): a chat template rendered in this
process (runtime/files/chat.py `render_source`, as every render ran before) against the same
render in the worker process under its address-space limit (runtime/files/chat_worker.py
`render_chat`), side by side, interleaved, in one run; the worker's first start timed apart.

    .venv/bin/python benchmarks/chat_render.py --renders 300

The template is SmolLM2-Instruct's (a system message by default, each message in
<|im_start|> markers), the conversation --messages messages of --words words each."""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from export.cpu import cpu_flags  # noqa: E402
from runtime.files.chat import CHAT_TEMPLATE, RENDER_CHARS, RENDER_SECONDS, render_source  # noqa: E402,E501
from runtime.files.chat_worker import RENDER_MEMORY, render_chat  # noqa: E402

TEMPLATE = ("{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' "
            "%}{{ '<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by "
            "Hugging Face<|im_end|>\n' }}{% endif %}{{'<|im_start|>' + message['role'] + '\n' + "
            "message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt "
            "%}{{ '<|im_start|>assistant\n' }}{% endif %}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--renders", type=int, default=300)
    parser.add_argument("--messages", type=int, default=8)
    parser.add_argument("--words", type=int, default=50)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    messages = [{"role": ("user", "assistant")[i % 2], "content": " ".join(["word"] * args.words)}
                for i in range(args.messages)]
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / CHAT_TEMPLATE
        path.write_text(TEMPLATE, encoding="utf-8")
        start = time.perf_counter()
        first = render_chat(path, messages)
        startup = time.perf_counter() - start
        times: dict[str, list[float]] = {"in process": [], "worker": []}
        for _ in range(args.renders):  # interleaved: the machine's load falls on both
            start = time.perf_counter()
            here = render_source(TEMPLATE, messages, "", "", RENDER_SECONDS, RENDER_CHARS)
            times["in process"].append(time.perf_counter() - start)
            start = time.perf_counter()
            there = render_chat(path, messages)
            times["worker"].append(time.perf_counter() - start)
            assert here == there == first
    result = {"machine": {"cpu_flags": cpu_flags(), "cores": os.cpu_count(),
                          "load_1min": os.getloadavg()[0]},
              "renders": args.renders, "prompt_chars": len(first),
              "worker_memory_limit_mib": RENDER_MEMORY >> 20,
              "worker_first_start_ms": round(startup * 1000, 1),
              "median_ms": {name: round(statistics.median(t) * 1000, 3)
                            for name, t in times.items()}}
    result["worker_over_in_process"] = round(result["median_ms"]["worker"]
                                             / result["median_ms"]["in process"], 2)
    print(json.dumps(result, indent=2))
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
