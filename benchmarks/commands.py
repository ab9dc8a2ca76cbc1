"""What the benchmarks share to run `zoo` as a user types it and report on stderr."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def zoo(*args: str) -> dict[str, float]:
    """One `zoo` command in a process of its own; its wall time and peak resident memory
    (GNU time's maximum resident set size)."""
    log("zoo " + " ".join(args))
    command = ["/usr/bin/time", "-f", "%e %M", sys.executable, "-c",
               "import sys, cli; sys.exit(cli.main())", *args]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run(command, cwd=ROOT, env=env, check=False, stderr=subprocess.PIPE,
                          text=True)
    if done.returncode:
        raise SystemExit(f"failed: zoo {' '.join(args)}\n{done.stderr[-2000:]}")
    seconds, kilobytes = done.stderr.strip().splitlines()[-1].split()
    return {"seconds": float(seconds), "peak_rss_gib": int(kilobytes) / 2**20}
