"""`zoo serve OUT...`: open each export, then run the app with uvicorn until SIGTERM or Ctrl-C
(uvicorn stops accepting, lets requests in flight finish within GRACE seconds; exit 0)."""

from __future__ import annotations

import logging
import os
import signal
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path

from registry.errors import ZooError
from runtime.serve.options import API_KEY_ENV, GRACE, ServeOptions
from runtime.serve.replicas import ray_plan


def serve_exports(folders: Sequence[Path], options: ServeOptions,
                  progress: Callable[[str], None] = lambda m: None) -> None:
    try:
        import uvicorn

        from runtime.serve.app import make_app
        from runtime.serve.http import MAX_HEADER_BYTES, JsonErrorsH11
    except ImportError as exc:
        raise ZooError(f"zoo serve needs the serve extra ({exc.name} is missing): pip install "
                       "'.[serve]' in a checkout (or 'zoo[serve]' beside the wheel)") from None
    names = list(options.names) or [Path(folder).resolve().name for folder in folders]
    if len(names) != len(folders):
        raise ZooError(f"--name: {len(names)} names for {len(folders)} exports; give one per OUT")
    if len(set(names)) != len(names):
        raise ZooError(f"two exports under one name ({', '.join(names)}): name them with --name")
    if not 0 <= options.port <= 65535:
        raise ZooError(f"--port {options.port}: should be a port number, 0 to 65535")
    if options.max_queue < 0:
        raise ZooError(f"--max-queue {options.max_queue}: should be >= 0")
    if options.max_batch < 1:
        raise ZooError(f"--max-batch {options.max_batch}: should be >= 1")
    if options.prefill_chunk < 1:
        raise ZooError(f"--prefill-chunk {options.prefill_chunk}: should be >= 1")
    if options.prefix_cache_mb < 0:
        raise ZooError(f"--prefix-cache-mb {options.prefix_cache_mb}: should be >= 0 (0 turns "
                       "the cache off)")
    plan = ray_plan(options, len(folders))
    api_key = options.api_key or os.environ.get(API_KEY_ENV) or None
    if options.ray:
        try:
            from runtime.serve.ray_app import serve_on_ray
        except ImportError as exc:
            raise ZooError(f"zoo serve --ray needs the ray extra ({exc.name} is missing): pip "
                           "install '.[ray]' in a checkout (or 'zoo[ray]' beside the wheel)"
                           ) from None
        return serve_on_ray(folders, names, replace(options, api_key=api_key), plan, progress)
    from runtime.serve.models import open_served

    models = open_served(folders, names, options)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    if options.tracebacks:
        logging.getLogger("zoo.serve").setLevel(logging.DEBUG)
    progress(f"serving {', '.join(models)} on http://{options.host}:{options.port}/v1"
             + (" (API key required)" if api_key else ""))
    # h11 named (not uvicorn's "auto", which takes httptools where it is installed): its
    # refusals are the ones worded as JSON (runtime/serve/http.py)
    config = uvicorn.Config(make_app(models, api_key, options.public_metrics),
                            host=options.host, port=options.port, http=JsonErrorsH11,
                            h11_max_incomplete_event_size=MAX_HEADER_BYTES,
                            log_level="warning", access_log=False,
                            timeout_graceful_shutdown=GRACE)
    # uvicorn handles SIGTERM and Ctrl-C itself, then raises the signal again for the handler
    # it found: the command's (SIGTERM as Ctrl-C, "Aborted!", exit 1) would turn a clean stop
    # into a failure, so none is found
    before = {sig: signal.signal(sig, signal.SIG_IGN) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        uvicorn.Server(config).run()
    finally:
        for sig, handler in before.items():
            signal.signal(sig, handler)
