"""`zoo serve`: exports behind an OpenAI-compatible HTTP server (runtime/serve/app.py).

Starlette on uvicorn: a small ASGI toolkit (no pydantic, no framework of models to learn) whose
StreamingResponse sends Server-Sent Events as a generator yields them, and uvicorn stops
accepting on SIGTERM, finishes what is in flight and exits 0. Both are imported only here and
by the command, so running an export needs neither (the `serve` extra installs them)."""
