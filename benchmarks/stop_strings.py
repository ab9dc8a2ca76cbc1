"""What a streamed answer's stop-string check costs the scheduler's thread a token (issue 43):
the check `zoo serve` ran before (each stop string's every prefix against the text's end, the
text searched whole) against runtime/serve/stops.py's automata, side by side in one run, for
four stop strings of 10, 100 and 1,000 characters over a 400-token answer of 4 characters a
token whose text keeps almost matching them (the worst case for the old check).

    .venv/bin/python benchmarks/stop_strings.py
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from export.cpu import cpu_flags  # noqa: E402
from runtime.serve.stops import StopFinder  # noqa: E402

TOKENS, CHARS_A_TOKEN = 400, 4


def before(text: str, stops: tuple[str, ...]) -> tuple[int | None, int]:
    """The scheduler's check before issue 43: find, then the longest held-back prefix."""
    cuts = [text.find(stop) for stop in stops if stop in text]
    if cuts:
        return min(cuts), 0
    return None, max((size for stop in stops for size in range(1, len(stop))
                      if text.endswith(stop[:size])), default=0)


def per_token(check, texts: list[str]) -> float:  # noqa: ANN001
    start = time.perf_counter()
    for text in texts:
        check(text)
    return (time.perf_counter() - start) / len(texts)


def main() -> None:
    answer = "ab" * (TOKENS * CHARS_A_TOKEN // 2)
    texts = [answer[:end] for end in range(CHARS_A_TOKEN, len(answer) + 1, CHARS_A_TOKEN)]
    rows = []
    for length in (10, 100, 1000):
        stops = tuple("ab" * (length // 2 - 1) + "x" + str(i) for i in range(4))
        finder = StopFinder(stops)
        old = per_token(lambda text, stops=stops: before(text, stops), texts)
        new = per_token(lambda text, finder=finder: finder.update(text), texts)
        rows.append({"stop_chars": length, "before_ms_a_token": round(old * 1000, 4),
                     "automata_ms_a_token": round(new * 1000, 4),
                     "ratio": round(old / new, 1)})
    print(json.dumps({"machine": {"cpu_flags": cpu_flags(), "cores": os.cpu_count(),
                                  "load_1min": os.getloadavg()[0]},
                      "tokens": TOKENS, "chars_a_token": CHARS_A_TOKEN, "rows": rows}, indent=2))


if __name__ == "__main__":
    main()
