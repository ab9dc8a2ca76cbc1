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
