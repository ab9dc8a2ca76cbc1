"""`zoo serve --ray`: the server's own app (runtime/serve/app.py: the same routes, errors,
API key, limits, 429s and batching scheduler) run by Ray Serve as deployment replicas. Ray
owns the process around it: its proxy takes the HTTP connections and routes each request to a
replica (the one with the fewest requests in flight, of two picked at random), streams the
answer back as the replica sends it (Server-Sent Events pass through), replaces a replica that
dies and scales their number. Each replica is a whole `zoo serve`: it opens the exports
itself and answers with an `x-zoo-replica` header naming it.

The only module that imports Ray (the `ray` extra); runtime/serve/server.py imports it inside
`zoo serve --ray`. `serve run runtime.serve.ray_app:build_app exports=OUT ...` (or `:app`
with ZOO_SERVE_ARGS) runs the same deployment from Ray's own command or a KubeRay
RayService (examples/ray/rayservice.yaml); docs/scaling.md says what each side owns."""

from __future__ import annotations

import logging
import os
import re
import signal
import socket
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import fields, replace
from pathlib import Path
from typing import Any

import ray
from ray import serve

from registry.errors import ZooError, first_line
from runtime.manifest import read_manifest
from runtime.serve.errors import log_fault
from runtime.serve.models import open_served
from runtime.serve.options import API_KEY_ENV, GRACE, ServeOptions
from runtime.serve.replicas import APP, ReplicaPlan, ray_plan

ARGS_ENV = "ZOO_SERVE_ARGS"  # `serve run runtime.serve.ray_app:app`: "exports=OUT max_batch=8"
REPLICA_HEADER = b"x-zoo-replica"
COPY_S = 5.0  # seconds between two copies of a replica's /metrics into Ray's metrics
SAMPLE = re.compile(r"^(zoo_\w+)(?:\{(.*)\})? (\S+)$")  # one series of the exposition
LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')
ESCAPED = re.compile(r"\\(.)")
LOG = logging.getLogger("zoo.serve")


@serve.ingress()  # the app is made in each replica, after its exports are open
class ZooReplica:
    """One replica: the exports opened under their names, and zoo serve's app over them."""

    def __init__(self, folders: list[str], names: list[str], options: ServeOptions) -> None:
        logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
        if options.tracebacks:
            logging.getLogger("zoo.serve").setLevel(logging.DEBUG)
        self.options = options
        self.models = open_served([Path(folder) for folder in folders], names, options)

    def __serve_build_asgi_app__(self) -> Any:
        from runtime.serve.app import exposition, make_app

        api_key = self.options.api_key or os.environ.get(API_KEY_ENV) or None
        app = make_app(self.models, api_key, self.options.public_metrics)
        app.add_middleware(ReplicaHeader, replica=replica_name())
        copier = RayMetrics(lambda: exposition(app.state.metrics, self.models))
        threading.Thread(target=copier.run, name="zoo-ray-metrics", daemon=True).start()
        return app


def replica_name() -> str:
    """Ray's id of the replica this runs in (as its logs and `serve status` show it)."""
    return serve.get_replica_context().replica_id.unique_id


class ReplicaHeader:
    """ASGI middleware: every answer names the replica that made it (`x-zoo-replica`), so a
    client or a test sees where its request went, and whose /metrics it read."""

    def __init__(self, app: Any, replica: str) -> None:
        self.app, self.replica = app, replica.encode()

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        async def tagged(message: dict[str, Any]) -> None:
            if message["type"] == "http.response.start":
                headers = [*message.get("headers", ()), (REPLICA_HEADER, self.replica)]
                message = {**message, "headers": headers}
            await send(message)

        await self.app(scope, receive, tagged)


class RayMetrics:
    """This replica's /metrics copied into Ray's metrics every COPY_S seconds, each series a
    gauge of the same name and labels (`ray_` before the name, as Ray exports its users'
    metrics) tagged with the deployment, the replica and the application: each node's Ray
    metrics port then serves every replica's zoo figures beside Ray Serve's own."""

    def __init__(self, exposition: Callable[[], str]) -> None:
        self.exposition = exposition
        self.gauges: dict[str, Any] = {}

    def run(self) -> None:
        while True:
            try:
                self.copy()
            except Exception as exc:  # a fault here must not end the copying, nor the replica
                log_fault(LOG, "copying /metrics to Ray", exc)
            time.sleep(COPY_S)

    def copy(self) -> None:
        from ray.serve.metrics import Gauge

        for line in self.exposition().splitlines():
            sample = SAMPLE.match(line)
            if sample is None:  # a comment
                continue
            name, labels, value = sample.groups()
            tags = {key: unescaped(text) for key, text in LABEL.findall(labels or "")}
            if name not in self.gauges:
                self.gauges[name] = Gauge(name, description=f"zoo serve's {name}",
                                          tag_keys=tuple(sorted(tags)))
            self.gauges[name].set(float(value), tags=tags)


def unescaped(text: str) -> str:
    """A label's value as it was before the exposition format escaped it."""
    return ESCAPED.sub(lambda found: "\n" if found[1] == "n" else found[1], text)


def deployment(folders: Sequence[Path], names: Sequence[str], options: ServeOptions,
               plan: ReplicaPlan) -> Any:
    """The Ray Serve application: `plan`'s replicas of ZooReplica over absolute paths (a
    replica's working folder is Ray's, not the command's)."""
    settings = plan.deployment_options(GRACE)
    return serve.deployment(ZooReplica).options(**settings).bind(
        [str(Path(folder).resolve()) for folder in folders], list(names), options)


def serve_on_ray(folders: Sequence[Path], names: Sequence[str], options: ServeOptions,
                 plan: ReplicaPlan, progress: Callable[[str], None]) -> None:
    """Run the deployment until SIGTERM or Ctrl-C, then drain it: Ray stops routing to the
    replicas and gives their requests in flight GRACE seconds. A Ray started here (no
    --ray-address) is stopped with it; on an existing cluster only the application goes."""
    local = options.ray_address is None
    if local:
        port_free(options.host, options.port)
    for folder in folders:  # a wrong folder is one line here, not a replica failing to start
        read_manifest(Path(folder), verify_files=False)
    if local:  # this machine alone, every replica fitting on it, reachable from it only
        cpus = max(os.cpu_count() or 1, int(plan.most * plan.cpus))
        started = ray.init(address="local", num_cpus=cpus, include_dashboard=False,
                           _node_ip_address="127.0.0.1", logging_level=logging.WARNING)
        port = started.address_info.get("metrics_export_port")
        if port:  # on a cluster its operator knows the port (ray start --metrics-export-port)
            progress(f"Ray's metrics (each replica's zoo_ figures beside Ray Serve's): "
                     f"http://127.0.0.1:{port}/metrics")
    else:
        try:
            ray.init(address=options.ray_address, logging_level=logging.WARNING)
        except (ConnectionError, RuntimeError, ValueError) as exc:
            raise ZooError(f"--ray-address {options.ray_address}: no Ray cluster answers there "
                           f"({first_line(exc)[:200]})") from None
    stop = threading.Event()
    before = {sig: signal.signal(sig, lambda *_: stop.set())
              for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        serve.start(http_options={"host": options.host, "port": options.port})
        try:
            serve.run(deployment(folders, names, options, plan), name=APP, route_prefix="/",
                      blocking=False)
        except RuntimeError as exc:  # a replica that could not start, after Ray's retries
            raise ZooError(f"zoo serve --ray: the replicas did not start: "
                           f"{first_line(exc)[:300]}") from None
        count = f"{plan.replicas} replica{'s' if plan.replicas != 1 else ''}" \
            if plan.autoscale is None else f"{plan.autoscale[0]} to {plan.autoscale[1]} replicas"
        progress(f"serving {', '.join(names)} on http://{options.host}:{options.port}/v1 "
                 f"with {count} (Ray Serve)" + (" (API key required)" if options.api_key
                                                 else ""))
        while not stop.wait(1.0):  # a signal's handler runs between two waits
            pass
        progress("draining: the replicas finish their requests in flight")
        serve.delete(APP)
    finally:
        if local:
            serve.shutdown()
            ray.shutdown()
        for sig, handler in before.items():
            signal.signal(sig, handler)


def port_free(host: str, port: int) -> None:
    """Refuse a port already taken, before Ray starts: its proxy would retry the bind in the
    background and the command would say it serves while another program answers."""
    with socket.socket() as probe:
        try:
            probe.bind((host, port))
        except OSError as exc:
            raise ZooError(f"--port {port}: cannot listen on {host}:{port} "
                           f"({exc.strerror or exc})") from None


def options_from(args: dict[str, Any]) -> tuple[list[Path], list[str], ServeOptions]:
    """`serve run ...:build_app exports=A,B max_batch=8 replicas=2` (or a config file's
    `args:`): the exports, their names and the options, values as text or YAML's types."""
    exports = args.get("exports")
    if not exports:
        raise ZooError("exports: missing; give the export folders, like exports=OUT[,OUT2]")
    folders = [Path(part) for part in (exports.split(",") if isinstance(exports, str)
                                       else exports)]
    known = {field.name: field for field in fields(ServeOptions)}
    values: dict[str, Any] = {}
    for key, value in args.items():
        if key == "exports":
            continue
        if key not in known or key in ("ray", "ray_address"):
            raise ZooError(f"{key}: not an option of the zoo's Ray app (known: exports, "
                           f"{', '.join(name for name in known if name != 'ray')})")
        values[key] = typed(key, str(known[key].type), value)
    options = replace(ServeOptions(), ray=True, **values)
    names = list(options.names) or [folder.resolve().name for folder in folders]
    return folders, names, options


def typed(key: str, kind: str, value: Any) -> Any:
    """An argument's value as its option's type (`serve run` gives every value as text)."""
    if not isinstance(value, str):
        return tuple(value) if kind.startswith("tuple") and isinstance(value, list) else value
    try:
        if kind.startswith("int"):
            return int(value)
        if kind == "bool":
            return value.lower() in ("1", "true", "yes")
        if kind.startswith("tuple[int"):
            from runtime.serve.options import replica_range

            return replica_range(value)
        if kind.startswith("tuple"):
            return tuple(value.split(","))
    except ValueError as exc:
        raise ZooError(f"{key}={value!r}: {exc}") from None
    return value


def build_app(args: dict[str, Any]) -> Any:
    """Ray Serve's application builder (`serve run runtime.serve.ray_app:build_app k=v`)."""
    folders, names, options = options_from(args)
    return deployment(folders, names, options, ray_plan(options, len(folders)))


def __getattr__(name: str) -> Any:
    """`app`, built when asked for (`serve run runtime.serve.ray_app:app`) from ZOO_SERVE_ARGS
    ("exports=OUT replicas=2"), so importing this module builds nothing."""
    if name != "app":
        raise AttributeError(name)
    pairs = os.environ.get(ARGS_ENV, "").split()
    return build_app(dict(pair.partition("=")[::2] for pair in pairs))
