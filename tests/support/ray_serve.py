"""`zoo serve --ray` in a subprocess (its own session, so the Ray it starts is found and, if it
does not stop by itself, killed with it), and the replica processes of that Ray."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from tests.support.serve import KEY, LABEL, ROOT

SERIES = re.compile(r"^(\w+)\{(.*)\} (\S+)$")
REPLICA_LINE = re.compile(r"\(ServeReplica:zoo:zoo pid=(\d+)\).* zoo_zoo (\w+) \S+ -- ")
STARTUP_S = 300  # Ray's start (about 25 s here when idle) and two replicas opening the export


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


class RayServer:
    def __init__(self, folders: list[Path], log: Path, *args: str) -> None:
        self.port, self.log = free_port(), log
        command = [sys.executable, "-c", "import cli; cli.main()", "serve", *map(str, folders),
                   "--ray", "--port", str(self.port), "--threads", "1", "--api-key", KEY, *args]
        # every replica's log lines whole (Ray folds alike lines of several processes into one)
        env = {**os.environ, "OMP_NUM_THREADS": "1", "RAY_USAGE_STATS_ENABLED": "0",
               "RAY_DEDUP_LOGS": "0"}
        with log.open("wb") as out:
            self.process = subprocess.Popen(command, cwd=ROOT, env=env, stdout=out, stderr=out,
                                            start_new_session=True)
        deadline = time.monotonic() + STARTUP_S
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise AssertionError(f"zoo serve --ray exited: {self.tail()}")
            if b"(Ray Serve)" in log.read_bytes():
                return
            time.sleep(0.5)
        self.kill()
        raise AssertionError(f"zoo serve --ray did not start in {STARTUP_S} s: {self.tail()}")

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def tail(self, size: int = 3000) -> str:
        return self.log.read_text(errors="replace")[-size:]

    def replica(self, path: str = "/health") -> str:
        """The replica that answers a GET (its x-zoo-replica header)."""
        request = urllib.request.Request(self.base + path,
                                         headers={"Authorization": f"Bearer {KEY}"})
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.headers["x-zoo-replica"]

    def ray_metrics(self, name: str, **labels: str) -> dict[str, float]:
        """A series of the Ray node's metrics (the URL `zoo serve --ray` printed), by the
        replica that set it, among those with `labels`."""
        url = re.search(r"Ray's metrics .*: (http://\S+/metrics)", self.log.read_text())
        assert url is not None, self.tail()
        with urllib.request.urlopen(url[1], timeout=30) as response:
            text = response.read().decode()
        found = {}
        for line in text.splitlines():
            series = SERIES.match(line)
            if series is None or series[1] != name:
                continue
            tags = dict(LABEL.findall(series[2]))
            if all(tags.get(key) == value for key, value in labels.items()):
                found[tags["replica"]] = float(series[3])
        return found

    def replica_pids(self) -> dict[str, int]:
        """Each replica's process, by its id: Ray's log lines name both (`(ServeReplica:zoo:zoo
        pid=PID) ... zoo_zoo ID REQUEST -- GET /health 200`)."""
        return {replica: int(pid) for pid, replica in
                REPLICA_LINE.findall(self.log.read_text(errors="replace"))}

    def processes(self, named: str = "") -> list[int]:
        """The processes of this server's session (the command and the Ray it started) whose
        command line holds `named`."""
        found = []
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            with contextlib.suppress(OSError, IndexError):
                session = (entry / "stat").read_text().rsplit(")", 1)[1].split()[3]
                command = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
                if int(session) == self.process.pid and named in command:
                    found.append(int(entry.name))
        return found

    def stop(self, timeout: float = 120) -> int:
        """SIGTERM: the replicas drain and the Ray started here stops; the exit status."""
        self.process.send_signal(signal.SIGTERM)
        return self.process.wait(timeout=timeout)

    def kill(self) -> None:
        """Whatever is left of the session, at once (a finalizer's last resort)."""
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait(timeout=30)
