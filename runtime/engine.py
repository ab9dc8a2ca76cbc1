"""What parity, generation and the benchmarks drive: `run(file, feeds) -> {output: array}`.

ONNX Runtime (runtime/sessions.Runtime) and PyTorch (export/torch_engine.TorchEngine) both
offer it, so the code that compares them drives both through exactly the same steps. The
running code reads the family's spec (registry/families.py); the exporter's drivers read
`family`, export's Family object, set where export opened the engine (export/opening.py).
"""

from __future__ import annotations

from typing import Any, Protocol

import numpy as np

from registry.catalog import Card
from registry.families import FamilySpec


class Engine(Protocol):
    card: Card
    spec: FamilySpec  # resolved once, where the engine was opened
    family: Any  # export's Family where export opened it; None where the runtime alone did

    def run(self, file: str, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]: ...
