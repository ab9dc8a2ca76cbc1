"""`zoo bench NAME|DIR`: PyTorch eager against ONNX Runtime on the same weights, in one run,
with the machine's own limits measured in that run (bench/machine.py), every figure a median
over repeated runs after warm-up with its spread (bench/timing.py).

NAME (a card, built with --seed, 0 by default) or a built folder is exported to a temporary
folder first (--optimize by default, since this measures speed); an export folder is used as it
is, with the reference weights it carries for the PyTorch side.
"""

from __future__ import annotations

import json
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from export.bench.context import Context
from export.bench.families import FamilyBench, bench_of
from export.bench.machine import cpu_name, load_average, matmul_flops, read_bandwidth
from export.bench.profile import temporary_folder
from export.onnx.manifest import package_versions
from export.onnx.precision import DTYPES
from export.onnx.quantize import CHOICES
from export.opening import open_export
from export.options import ExportOptions
from export.pipeline import export_and_verify
from registry.errors import ZooError
from registry.families import spec_of
from registry.options import option
from runtime.contract import MANIFEST
from runtime.files.atomic import output_file, write_file
from runtime.sessions import PROVIDERS, Runtime
from zoo.files.sources import load_source, source_card
from zoo.files.weights import WEIGHTS, load_built

FORMAT_VERSION = 1
Progress = Callable[[str], None]


class BenchError(ZooError):
    """The benchmark cannot run as asked (e.g. CUDA that is not there)."""


@dataclass
class BenchOptions:
    provider: str = option("cpu", "ONNX Runtime's execution provider.", choices=PROVIDERS)
    threads: int | None = option(None, "Threads for ONNX Runtime and torch [all cores].")
    repeats: int = option(10, "Timed runs per figure (slow figures a third), after three "
                          "warm-up runs.")
    optimize: bool = option(True, "When exporting NAME or a built folder: --optimize it.",
                            flags=("--optimize/--no-optimize",))
    quantize: str | None = option(None, "When exporting NAME or a built folder: --quantize it.",
                                  choices=CHOICES)
    dtype: str = option("fp32", "When exporting NAME or a built folder: --dtype it.",
                        choices=DTYPES)
    profile: bool = option(False, "Add ONNX Runtime's per-operator times.")
    seed: int = option(0, "Seed when building a card.")


def _subject(source: str, registries: tuple[str, ...], options: BenchOptions, work: Path,
             progress: Progress) -> tuple[Path, torch.nn.Module, Any]:
    folder = Path(source)
    if (folder / MANIFEST).is_file():
        model, card = load_built(folder)  # the reference weights the export carries
        return folder, model, card
    progress(f"loading {source}...")
    model, card = load_source(source, registries, options.seed)
    out = work / "export"
    export_and_verify(model, card, out, ExportOptions(optimize=options.optimize,
                                                      quantize=options.quantize,
                                                      dtype=options.dtype), progress)
    return out, model, card


def _export_facts(folder: Path, runtime: Runtime) -> dict[str, Any]:
    onnx_bytes = sum(p.stat().st_size for p in folder.rglob("*")
                     if p.suffix == ".onnx" or p.name.endswith((".onnx.data", ".onnx_data")))
    weights = folder / WEIGHTS
    manifest = runtime.manifest
    return {
        "optimized": "optimization" in manifest,
        "quantized": manifest.get("quantization", {}).get("weights", "fp32"),
        "dtype": manifest.get("precision", {}).get("dtype", "fp32"),
        "shared_cache_graph": runtime.kv_graph is not None,
        "onnx_bytes": onnx_bytes,
        "safetensors_bytes": weights.stat().st_size if weights.is_file() else 0,
        "fused": manifest.get("optimization", {}).get("fused", {}),
    }


def _limits(options: BenchOptions, progress: Progress) -> dict[str, float]:
    progress("measuring the machine: one large matmul (ORT, torch) and a 1 GiB read...")
    probes = max(2, min(5, options.repeats))  # a quick run (tests) probes quickly too
    return {**matmul_flops(options.provider, options.threads, repeats=probes),
            **read_bandwidth(options.provider, options.threads, repeats=probes)}


def rescale(measurements: dict[str, dict[str, dict[str, float]]], limits: dict[str, float]
            ) -> None:
    """Recompute every fraction against the best the machine showed in this run: the matmul
    rate of the same library, or the larger of the run's read bandwidth and the probe taken
    next to the figure."""
    for engines in measurements.values():
        for engine, figure in engines.items():
            if "gflop_per_s" in figure:
                limit = limits["torch_flops_per_s" if engine == "torch" else "ort_flops_per_s"]
                figure["limit_gflop_per_s"] = limit / 1e9
                figure["fraction_of_limit"] = figure["gflop_per_s"] * 1e9 / limit
            elif "gbytes_per_s" in figure:
                limit = max(limits["bound_bytes_per_s"], figure["probe_gbytes_per_s"] * 1e9)
                figure["limit_gbytes_per_s"] = limit / 1e9
                figure["fraction_of_limit"] = figure["gbytes_per_s"] * 1e9 / limit


def summary(bench: FamilyBench, measurements: dict[str, dict[str, dict[str, float]]],
            export: dict[str, Any]) -> dict[str, float]:
    """The ratios the targets are stated in (see BENCHMARKS.md)."""
    result: dict[str, float] = {}
    if export["safetensors_bytes"]:
        result["onnx_bytes_over_safetensors"] = export["onnx_bytes"] / export["safetensors_bytes"]
    return {**result, **bench.summary(measurements)}


def run_bench(source: str, registries: tuple[str, ...] = (), options: BenchOptions | None = None,
              progress: Progress = lambda message: None) -> dict[str, Any]:
    options = options or BenchOptions()
    if options.provider == "cuda" and not torch.cuda.is_available():
        raise BenchError("--provider cuda: torch sees no CUDA device here")
    bench = bench_of(spec_of(source_card(source, registries)))  # before any export or probe
    if options.threads:
        torch.set_num_threads(options.threads)
    started = time.time()
    load_before = load_average()
    with tempfile.TemporaryDirectory(prefix="zoo-bench-") as tmp:
        folder, model, card = _subject(source, registries, options, Path(tmp), progress)
        device = "cuda" if options.provider == "cuda" else "cpu"
        model = model.eval().to(device)
        runtime = open_export(folder, options.provider, options.threads)
        start = _limits(options, progress)
        context = Context(runtime, model, card, device, options.repeats, dict(start), progress)
        measurements = bench.measure(context)
        # The memory bandwidth of these shared machines drifts: probe again and scale by the
        # best of both, so every fraction is of the best the machine showed in this run.
        end = _limits(options, progress)
        limits = {key: max(start[key], end[key]) for key in start}
        rescale(measurements, limits)
        export = _export_facts(folder, runtime)
        profile = None
        if options.profile:  # per-operator milliseconds for the graphs the benchmark leans on
            with temporary_folder() as traces:
                profile = bench.profile(runtime, card, options.threads, Path(traces))
    result: dict[str, Any] = {
        "format_version": FORMAT_VERSION,
        "date": time.strftime("%Y-%m-%dT%H:%M:%S%z", time.localtime(started)),
        "model": {"name": card.name, "family": card.family,
                  "parameters": sum(p.numel() for p in model.parameters())},
        "export": export,
        "settings": {"provider": options.provider, "ort_threads": options.threads or 0,
                     "torch_threads": torch.get_num_threads(), "repeats": options.repeats},
        "machine": {"cpu": cpu_name(), "load_before": load_before,
                    "load_after": load_average(), **limits, "start": start, "end": end},
        "versions": package_versions(),
        "measurements": measurements,
        "summary": summary(bench, measurements, export),
        "seconds": time.time() - started,
    }
    if profile is not None:
        result["profile"] = profile
    return result


def bench_command(source: str, registries: tuple[str, ...], options: BenchOptions,
                  json_path: Path | None = None, force: bool = False,
                  progress: Progress = lambda message: None) -> list[str]:
    """`zoo bench`: the figures rendered, and written to `json_path` where asked."""
    if options.repeats < 1 or (options.threads is not None and options.threads < 1):
        raise BenchError("--repeats and --threads should be >= 1")
    if json_path is None:
        return [render(run_bench(source, registries, options, progress))]
    with output_file(json_path, force):  # refused before minutes of measuring, not after
        result = run_bench(source, registries, options, progress)
        write_json(result, json_path, force)
    return [render(result), f"wrote {json_path}"]


def write_json(result: dict[str, Any], path: Path, force: bool) -> None:
    """Atomically (temporary file, then rename); an existing file only with force."""
    write_file(path, (json.dumps(result, indent=2) + "\n").encode("utf-8"), force)


def _rate(figure: dict[str, float]) -> str:
    if "gflop_per_s" in figure:
        return f"{figure['gflop_per_s']:7.1f} GFLOP/s"
    if "tokens_per_s" in figure:
        return f"{figure['tokens_per_s']:7.1f} tok/s  "
    if "gbytes_per_s" in figure:
        return f"{figure['gbytes_per_s']:7.1f} GB/s   "
    return " " * 15


def render(result: dict[str, Any]) -> str:
    """The human-readable table `zoo bench` prints."""
    m, machine, export = result["model"], result["machine"], result["export"]
    lines = [
        f"{m['name']} ({m['family']}, {m['parameters'] / 1e6:.1f}M parameters), "
        f"{result['settings']['provider']}, export: {export['quantized']}"
        f"{', optimized' if export['optimized'] else ''}"
        f"{', shared-cache loop' if export['shared_cache_graph'] else ''}",
        f"machine: {machine['cpu']}; load {machine['load_before'][0]:.2f} before, "
        f"{machine['load_after'][0]:.2f} after",
        f"limits: matmul {int(machine['size'])}^3 ORT {machine['ort_flops_per_s'] / 1e9:.1f} "
        f"GFLOP/s, torch {machine['torch_flops_per_s'] / 1e9:.1f} GFLOP/s; 1 GiB read "
        f"numpy {machine['numpy_bytes_per_s'] / 1e9:.1f} GB/s, torch "
        f"{machine['torch_bytes_per_s'] / 1e9:.1f} GB/s, ORT row x matrix "
        f"{machine['ort_gemv_bytes_per_s'] / 1e9:.1f} GB/s",
        f"{'measurement':<18} {'engine':<10} {'median':>10} {'p10-p90 (ms)':>17}  "
        f"{'rate':<15} {'of limit':>8}",
    ]
    for name, engines in result["measurements"].items():
        for engine, f in engines.items():
            spread = f"{f['p10_ms']:.1f}-{f['p90_ms']:.1f}"
            share = f"{f['fraction_of_limit']:.0%}" if "fraction_of_limit" in f else ""
            lines.append(f"{name:<18} {engine:<10} {f['median_ms']:>7.1f} ms {spread:>17}  "
                         f"{_rate(f)} {share:>8}")
    for key, value in result["summary"].items():
        lines.append(f"{key}: {value:.3f}")
    for graph, times in result.get("profile", {}).items():
        total = sum(times.values())
        top = ", ".join(f"{op} {ms:.2f}" for op, ms in list(times.items())[:8])
        lines.append(f"profile {graph}: {total:.2f} ms in kernels; {top}")
    return "\n".join(lines)
