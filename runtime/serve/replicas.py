"""`zoo serve --ray`'s options turned into a Ray Serve deployment's settings, checked before
Ray is imported or started (so a wrong option is one line at once, and `zoo serve --help`
needs no Ray). runtime/serve/ray_app.py applies them.

Each replica is a whole `zoo serve` (its own scheduler, queue and limits), so:
- `max_ongoing_requests` (what Ray's router sends a replica at once) is above what the
  replica admits (`max_batch + max_queue` per export) by HEADROOM: past its queue the replica
  answers 429 itself, as `zoo serve` does, and /health or /metrics still get through;
- autoscaling's `target_ongoing_requests` is `max_batch`: a replica whose batch is full and
  has requests waiting counts as busy, and Ray adds one (up to MAX)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from registry.errors import ZooError
from runtime.serve.options import ServeOptions

HEADROOM = 8  # requests past a replica's admission limit that Ray may still send it
APP = "zoo"  # the Ray Serve application's and deployment's name


@dataclass(frozen=True)
class ReplicaPlan:
    replicas: int | None  # a fixed count, or None when autoscaled
    autoscale: tuple[int, int] | None
    max_ongoing: int
    target_ongoing: int
    cpus: float  # Ray CPUs each replica reserves

    @property
    def most(self) -> int:
        """The most replicas this plan may run at once."""
        return self.autoscale[1] if self.autoscale is not None else self.replicas or 1

    def deployment_options(self, grace: float) -> dict[str, Any]:
        """Keyword arguments of Ray Serve's `Deployment.options`; `grace`: seconds a stopping
        replica gives its requests in flight."""
        settings: dict[str, Any] = {
            "name": APP, "max_ongoing_requests": self.max_ongoing,
            "graceful_shutdown_timeout_s": grace, "graceful_shutdown_wait_loop_s": 1.0,
            "ray_actor_options": {"num_cpus": self.cpus}}
        if self.autoscale is None:
            settings["num_replicas"] = self.replicas
        else:
            low, high = self.autoscale
            settings["autoscaling_config"] = {
                "min_replicas": low, "max_replicas": high, "initial_replicas": max(low, 1),
                "target_ongoing_requests": self.target_ongoing}
        return settings


def ray_plan(options: ServeOptions, exports: int) -> ReplicaPlan:
    """The deployment `options` ask for, serving `exports` exports per replica; a ZooError
    names the option that is wrong."""
    ray_only = {"--replicas": options.replicas, "--autoscale": options.autoscale,
                "--ray-address": options.ray_address}
    given = [flag for flag, value in ray_only.items() if value is not None]
    if not options.ray:
        if given:
            raise ZooError(f"{given[0]}: only with --ray (serving on Ray Serve)")
    if options.replicas is not None and options.autoscale is not None:
        raise ZooError("--replicas and --autoscale: give one (a fixed count, or MIN:MAX)")
    if options.replicas is not None and options.replicas < 1:
        raise ZooError(f"--replicas {options.replicas}: should be >= 1")
    if options.port == 0:
        raise ZooError("--port 0 with --ray: Ray Serve's proxy listens on a port named "
                       "beforehand; give one")
    admitted = (options.max_batch + options.max_queue) * exports
    return ReplicaPlan(None if options.autoscale is not None else options.replicas or 1,
                       options.autoscale, admitted + HEADROOM, options.max_batch,
                       float(options.threads or 1))
