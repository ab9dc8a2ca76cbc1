"""What parity, generation and the benchmarks drive: `run(file, feeds) -> {output: array}`.

ONNX Runtime (runtime/sessions.Runtime) and PyTorch (runtime/engines.TorchEngine) both offer
it, so the code that compares them drives both through exactly the same steps.
"""

from __future__ import annotations

from typing import Protocol

import numpy as np

from export.family import Family
from registry.catalog import Card


class Engine(Protocol):
    card: Card
    family: Family  # resolved once, where the engine was opened

    def run(self, file: str, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]: ...
