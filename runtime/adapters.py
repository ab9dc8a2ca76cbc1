"""The LoRA adapters of an export made with `zoo export --adapters keep`: each adapted linear's
factors are graph inputs (runtime/contract.py `lora_inputs`), and each adapter is an ONNX
Runtime adapter file (onnxruntime.AdapterFormat) holding one value per input.

`feeds(rows)` gives the inputs for a batch: the factors stacked along their leading axis, one
per row (S-LoRA's and Punica's per-row index made dense): each row's A and B, smaller ranks
padded with zeros (exact), a row without an adapter all zeros. That axis is the batch's own
(the traced graph may read the batch size from it), so a batch of one takes a file's tensors as
they are and a larger batch their copies. The stacked tensors are built once per batch
composition (the rows' adapters in order) and kept for the steps that follow.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort

from registry.errors import ZooError, first_line
from registry.paths import display_path, inside
from runtime.contract import ADAPTERS, MANIFEST, lora_inputs

Factors = dict[str, np.ndarray]  # graph input name -> (1, in, r) or (1, r, out)
KEPT_COMPOSITIONS = 4  # stacked feeds kept (the latest batch compositions): a step repeats
# its batch's until a row joins or leaves; 16 rows of SmolLM2's q and v at r 8 are 36 MB


class AdapterError(ZooError):
    """An adapter that is not in the export, or a file whose tensors are not its inputs."""


class Adapters:
    """The adapters an export keeps apart (none: an export without them), by name."""

    def __init__(self, folder: Path, manifest: dict[str, Any]) -> None:
        self.where = display_path(Path(folder) / MANIFEST)
        entry = manifest.get(ADAPTERS) or {}
        linears = entry.get("linears", []) if isinstance(entry, dict) else None
        files = entry.get("files", {}) if isinstance(entry, dict) else None
        if not isinstance(linears, list) or not isinstance(files, dict) or not all(
                isinstance(linear, dict) and {"lora_A", "lora_B", "in", "out"} <= set(linear)
                for linear in linears):
            raise AdapterError(f"{self.where}: field '{ADAPTERS}' should hold 'linears' (each "
                               "with lora_A, lora_B, in, out) and 'files'")
        # input name -> (the size of its fixed axis, that axis: 1 for A's in, 2 for B's out)
        self.fixed: dict[str, tuple[int, int]] = {}
        for linear in linears:
            self.fixed[linear["lora_A"]] = (int(linear["in"]), 1)
            self.fixed[linear["lora_B"]] = (int(linear["out"]), 2)
        self.files = {str(name): inside(Path(folder), str(file), self.where,
                                        f"{ADAPTERS}.files")
                      for name, file in files.items()}
        self.loaded: dict[str, Factors] = {}
        self.active: str | None = None
        self._stacked: dict[tuple[str | None, ...], Factors] = {}
        self._lock = threading.Lock()  # `zoo serve`: the batching thread and the worker

    @property
    def inputs(self) -> list[str]:
        return list(self.fixed)

    @property
    def names(self) -> list[str]:
        return sorted(self.files)

    def known(self, name: str, what: str = "--adapter") -> str:
        """`name`, or a one-line refusal listing the adapters this export has."""
        if name not in self.files:
            have = ", ".join(self.names) if self.files else \
                "none: export with --adapters keep"
            raise AdapterError(f"{what} {name}: not an adapter of this export (known: {have})")
        return name

    def activate(self, name: str | None) -> None:
        """The adapter every run uses unless told otherwise (None: the base)."""
        self.active = None if name is None else self.known(name)

    def add(self, name: str, path: Path) -> None:
        """Another adapter file (`zoo serve --adapter NAME=FILE`), read and checked now."""
        if name in self.files:
            raise AdapterError(f"--adapter {name}={display_path(path)}: the name {name} is "
                               "already taken")
        self.loaded[name] = read_factors(path, self.fixed)
        self.files[name] = path

    def factors(self, name: str) -> Factors:
        if name not in self.loaded:
            self.loaded[self.known(name)] = read_factors(self.files[name], self.fixed)
        return self.loaded[name]

    def feeds(self, rows: Sequence[str | None] | None = None, batch: int = 1) -> Factors:
        """The adapter inputs for a batch whose row i uses adapter rows[i] (None: the base);
        rows None: the active adapter for each of `batch` rows."""
        names = [self.active] * batch if rows is None else list(rows)
        with self._lock:
            if len(names) == 1:
                return self._one(names[0])
            key = tuple(names)
            if key not in self._stacked:
                if len(self._stacked) >= KEPT_COMPOSITIONS:
                    self._stacked.pop(next(key for key in self._stacked if key != (None,)))
                self._stacked[key] = self._stack(names)
            return self._stacked[key]

    def _one(self, name: str | None) -> Factors:
        if name is not None:
            return self.factors(name)
        if None not in self._stacked:  # rank 1 of zeros: the base
            self._stacked[(None,)] = {input_name: np.zeros(_shape(size, axis, 1), np.float32)
                                      for input_name, (size, axis) in self.fixed.items()}
        return self._stacked[(None,)]

    def _stack(self, names: list[str | None]) -> Factors:
        per_row = [None if name is None else self.factors(name) for name in names]
        stacked = {}
        for input_name, (size, axis) in self.fixed.items():
            rank_axis = 3 - axis  # A's rank is its axis 2, B's its axis 1
            rank = max((row[input_name].shape[rank_axis] for row in per_row if row), default=1)
            value = np.zeros((len(names), *_shape(size, axis, rank)[1:]), np.float32)
            for index, row in enumerate(per_row):
                if row is not None:
                    factor = row[input_name][0]
                    value[index, :factor.shape[0], :factor.shape[1]] = factor
            stacked[input_name] = value
        return stacked


def _shape(size: int, axis: int, rank: int) -> tuple[int, int, int]:
    return (1, size, rank) if axis == 1 else (1, rank, size)


def read_factors(path: Path, fixed: dict[str, tuple[int, int]]) -> Factors:
    """An adapter file's tensors, after checking they are exactly the graph's adapter inputs:
    the same names, float32, shapes (1, in, r) and (1, r, out) with one r per linear."""
    where = display_path(path)
    if not Path(path).is_file():
        raise AdapterError(f"{where}: no such adapter file")
    try:
        parameters = ort.AdapterFormat.read_adapter(str(path)).get_parameters()
        factors = {name: np.array(value.numpy()) for name, value in parameters.items()}
    except Exception as exc:  # ORT raises its own types; one line
        raise AdapterError(f"{where}: not an ONNX Runtime adapter file: {first_line(exc)}"
                           ) from exc
    missing = sorted(set(fixed) - set(factors))
    unexpected = sorted(set(factors) - set(fixed))
    if missing or unexpected:
        raise AdapterError(f"{where}: its tensors are not this export's adapter inputs: "
                           f"missing {missing[:3] or 'none'}, unexpected "
                           f"{unexpected[:3] or 'none'}")
    for name, value in factors.items():
        size, axis = fixed[name]
        rank = value.shape[3 - axis] if value.ndim == 3 else 0
        if value.dtype != np.float32 or value.shape != _shape(size, axis, rank) or rank < 1:
            raise AdapterError(f"{where}: {name}: {value.dtype} {list(value.shape)}, expected "
                               f"float32 {list(_shape(size, axis, 'r'))}")  # type: ignore[arg-type]
    for name, value in factors.items():
        if fixed[name][1] == 1:
            partner = lora_inputs(name.removesuffix(".lora_A"))[1]
            if partner in factors and factors[partner].shape[1] != value.shape[2]:
                raise AdapterError(f"{where}: {name} has rank {value.shape[2]} but {partner} "
                                   f"{factors[partner].shape[1]}")
    return factors
