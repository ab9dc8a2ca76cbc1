"""`zoo serve`'s options (no web library imported here, so `zoo serve --help` answers without
the `serve` extra)."""

from __future__ import annotations

from dataclasses import dataclass

from registry.options import option
from runtime.sessions import PROVIDERS

API_KEY_ENV = "ZOO_API_KEY"
PREFILL_TOKENS = 512  # prompt tokens (padded) prefilled a step; longer prompts are chunked
# MiB of prompt keys/values kept per decoder export: about 11,000 tokens of SmolLM2-135M
# (46 KiB a token in float32), 2,000 of an 8B model's; a laptop spares it
PREFIX_CACHE_MB = 512
GRACE = 30  # seconds a stopping server (or Ray replica) gives the requests in flight


def replica_range(text: str) -> tuple[int, int]:
    """--autoscale MIN:MAX: the bounds of a Ray deployment's replica count."""
    low, sep, high = text.partition(":")
    if not (sep and low.isdigit() and high.isdigit()):
        raise ValueError("expected MIN:MAX replicas, like 1:4")
    if not 0 <= int(low) <= int(high) or int(high) < 1:
        raise ValueError("expected 0 <= MIN <= MAX and MAX >= 1")
    return int(low), int(high)


@dataclass(frozen=True)
class ServeOptions:
    host: str = option("127.0.0.1", "Address to listen on (another than 127.0.0.1 opens the "
                       "server to the network).")
    port: int = option(8000)
    api_key: str | None = option(None, "Requests must send `Authorization: Bearer KEY` "
                                 f"[env {API_KEY_ENV}].")
    max_queue: int = option(64, "Requests that may wait per export behind the running ones; "
                            "past it a request gets 429.")
    max_batch: int = option(16, "Requests a decoder export decodes together (continuous "
                            "batching: one token for every row a step).")
    prefill_chunk: int = option(PREFILL_TOKENS, "Prompt tokens a decoder export prefills a "
                                "step; a longer prompt is prefilled in chunks of it between "
                                "the decoding steps of the others.")
    prefix_cache_mb: int = option(PREFIX_CACHE_MB, "MiB of prompt keys/values a decoder "
                                  "export keeps for later prompts that begin with the same "
                                  "tokens (least recently used evicted); 0 turns it off.")
    names: tuple[str, ...] = option((), "The name clients use for each OUT, in order [its "
                                    "folder's name].", flags=("--name",))
    adapters: tuple[str, ...] = option(
        (), "NAME=FILE: a LoRA adapter file (an --adapters keep export's "
        "adapters/NAME.onnx_adapter, made for the same base) served over the first OUT as the "
        "model OUT:NAME; repeat for more. That export's own adapters are served so too; "
        "requests for different adapters decode in one batch.", flags=("--adapter",))
    provider: str = option("cpu", "ONNX Runtime's execution provider.", choices=PROVIDERS)
    threads: int | None = option(None, "ONNX Runtime CPU threads per export [all cores].")
    public_metrics: bool = option(False, "Serve GET /metrics without the API key (for a "
                                  "Prometheus that sends none).")
    tracebacks: bool = option(False, "Log each internal error's traceback (one line "
                              "without).")
    # Ray Serve (runtime/serve/ray_app.py, the `ray` extra; docs/scaling.md)
    ray: bool = option(False, "Serve as Ray Serve deployment replicas, each running this "
                       "server (a local Ray started here, or --ray-address's).")
    replicas: int | None = option(None, "With --ray: this many replicas [1].")
    autoscale: tuple[int, int] | None = option(
        None, "With --ray: between MIN and MAX replicas, Ray adding one while each has more "
        "than --max-batch requests running or waiting.", parse=replica_range, metavar="MIN:MAX")
    ray_address: str | None = option(None, "With --ray: an existing Ray cluster's address "
                                     "(ray://HOST:10001, HOST:6379 or auto) [a local Ray, "
                                     "stopped with the server].")
