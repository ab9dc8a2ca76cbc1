"""GET /metrics in Prometheus' text exposition format (version 0.0.4), written by hand: the
request and token counters, time to first token as a histogram, and each export's queue
length, batch size and prefix cache's counters read from its Served at scrape time. The
event loop and the exports' worker threads both update it, so every change and the scrape
hold one lock."""

from __future__ import annotations

import threading
from collections import defaultdict
from collections.abc import Iterable

# seconds; the tiny exports answer in milliseconds, a real model on a CPU in seconds
TTFT_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)


def label(value: str) -> str:
    """A label value quoted as the format wants (backslash, quote and newline escaped)."""
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'


class Metrics:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.requests: dict[tuple[str, str, int], int] = defaultdict(int)
        self.tokens: dict[tuple[str, str], int] = defaultdict(int)
        self.ttft_buckets: dict[str, list[int]] = {}
        self.ttft_sum: dict[str, float] = defaultdict(float)

    def request(self, model: str, route: str, status: int) -> None:
        with self.lock:
            self.requests[model, route, status] += 1

    def counted(self, model: str, prompt: int, completion: int) -> None:
        with self.lock:
            self.tokens[model, "prompt"] += prompt
            self.tokens[model, "completion"] += completion

    def first_token(self, model: str, seconds: float) -> None:
        with self.lock:
            counts = self.ttft_buckets.setdefault(model, [0] * (len(TTFT_BUCKETS) + 1))
            for index, bound in enumerate((*TTFT_BUCKETS, float("inf"))):
                counts[index] += seconds <= bound  # cumulative, as the format's buckets are
            self.ttft_sum[model] += seconds

    def text(self, gauges: Iterable[tuple[str, int, int, int, int, int]],
             caches: Iterable[tuple[str, int, int, int, int]] = ()) -> str:
        """The exposition; `gauges` is (model, queue length, batch size, decoding steps, rows
        decoded, largest batch) per export, `caches` (model, prompt tokens hit, missed, bytes
        held, bound) per export with a prefix cache."""
        lines = ["# HELP zoo_requests_total Requests answered, by model, route and status.",
                 "# TYPE zoo_requests_total counter"]
        with self.lock:
            for (model, route, status), count in sorted(self.requests.items()):
                lines.append(f"zoo_requests_total{{model={label(model)},route={label(route)},"
                             f"status={label(str(status))}}} {count}")
            lines += ["# HELP zoo_tokens_total Tokens read (prompt) and generated (completion).",
                      "# TYPE zoo_tokens_total counter"]
            for (model, kind), count in sorted(self.tokens.items()):
                lines.append(f"zoo_tokens_total{{model={label(model)},kind={label(kind)}}} "
                             f"{count}")
            lines += ["# HELP zoo_time_to_first_token_seconds From a generating request's "
                      "arrival to its first token ready to send.",
                      "# TYPE zoo_time_to_first_token_seconds histogram"]
            for model, counts in sorted(self.ttft_buckets.items()):
                name, key = "zoo_time_to_first_token_seconds", f"model={label(model)}"
                for bound, count in zip((*TTFT_BUCKETS, float("inf")), counts, strict=True):
                    le = "+Inf" if bound == float("inf") else repr(bound)
                    lines.append(f"{name}_bucket{{{key},le={label(le)}}} {count}")
                lines.append(f"{name}_sum{{{key}}} {self.ttft_sum[model]!r}")
                lines.append(f"{name}_count{{{key}}} {counts[-1]}")
        lines += ["# HELP zoo_queue_length Requests waiting behind the running ones.",
                  "# TYPE zoo_queue_length gauge"]
        gauges = list(gauges)
        lines += [f"zoo_queue_length{{model={label(m)}}} {g[0]}" for m, *g in gauges]
        lines += ["# HELP zoo_batch_size Requests being decoded together now.",
                  "# TYPE zoo_batch_size gauge"]
        lines += [f"zoo_batch_size{{model={label(m)}}} {g[1]}" for m, *g in gauges]
        for name, index, what, kind in (
                ("zoo_decode_steps_total", 2, "Decoding steps run (one token for every row).",
                 "counter"),
                ("zoo_decoded_rows_total", 3, "Rows decoded over all steps (over the steps: "
                 "the mean batch size).", "counter"),
                ("zoo_batch_size_max", 4, "The largest batch decoded so far.", "gauge")):
            lines += [f"# HELP {name} {what}", f"# TYPE {name} {kind}"]
            lines += [f"{name}{{model={label(m)}}} {g[index]}" for m, *g in gauges]
        caches = list(caches)
        for name, index, what, kind in (
                ("zoo_prefix_cache_hit_tokens_total", 0, "Prompt tokens whose keys/values came "
                 "from the prefix cache.", "counter"),
                ("zoo_prefix_cache_miss_tokens_total", 1, "Prompt tokens prefilled (not in the "
                 "prefix cache).", "counter"),
                ("zoo_prefix_cache_bytes", 2, "Bytes of keys/values the prefix cache holds.",
                 "gauge"),
                ("zoo_prefix_cache_limit_bytes", 3, "The prefix cache's bound "
                 "(--prefix-cache-mb).", "gauge")):
            lines += [f"# HELP {name} {what}", f"# TYPE {name} {kind}"]
            lines += [f"{name}{{model={label(m)}}} {c[index]}" for m, *c in caches]
        return "\n".join(lines) + "\n"
