"""Quieting the libraries we drive: their warnings and caught tracebacks are noise to a user,
since every failure is raised to us and reported in one line."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator


@contextlib.contextmanager
def quiet_loggers(*names: str, disable: int | None = None) -> Iterator[None]:
    """Raise the named loggers to CRITICAL for the block; with `disable`, also drop every record
    at or under that level (ORT's optimizer and quantizer log each attempt on the root)."""
    loggers = [logging.getLogger(name) for name in names]
    levels = [logger.level for logger in loggers]
    for logger in loggers:
        logger.setLevel(logging.CRITICAL)
    if disable is not None:
        logging.disable(disable)
    try:
        yield
    finally:
        if disable is not None:
            logging.disable(logging.NOTSET)
        for logger, level in zip(loggers, levels, strict=True):
            logger.setLevel(level)
