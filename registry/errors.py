"""Errors a user can cause. The CLI prints them as one line and exits 2."""

from __future__ import annotations

import importlib
from typing import Any


class ZooError(Exception):
    """A problem with the user's input: a card, a file, an option. Its message is one line."""


class CardError(ZooError):
    """A card that cannot be read, resolved or validated."""


def needs_package(package: str, where: str) -> Any:
    """The optional package a kind of file is read with, or one line saying how to install it
    (sentencepiece for MarianMT's spm files, gguf for GGUF files)."""
    try:
        return importlib.import_module(package)
    except ImportError as exc:
        raise ZooError(f"{where}: reading it needs the {package} package "
                       f"(pip install {package})") from exc


def first_line(exc: BaseException, default: str | None = None) -> str:
    """The first line of an exception's message, for one-line errors from libraries whose
    messages run over many lines (or are empty: then `default`, else the type's name)."""
    text = str(exc).strip()
    if text:
        return text.splitlines()[0]
    return type(exc).__name__ if default is None else default


class FaultError(ZooError):
    """Not the input's fault but the machine's or another run's: a full disk, a read-only
    location, an output folder another zoo run is writing. One line too, and exit code 1."""

    exit_code = 1
