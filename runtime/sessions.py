"""ONNX Runtime sessions over an exported folder, with provider checks and feed validation.

Asking for CUDA and not getting it is an error: `onnxruntime-gpu` lists the CUDA provider even
where it cannot load and then quietly runs on CPU, so the check reads `session.get_providers()`
after the session is made.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort

from registry.catalog import Card
from registry.errors import ZooError, first_line
from registry.families import spec_of
from registry.paths import display_path
from runtime.adapters import Adapters
from runtime.contract import CACHE_OUTPUT, LAYOUT, MANIFEST, RENAMING_ENTRIES, stored_files

PROVIDERS = {"cpu": "CPUExecutionProvider", "cuda": "CUDAExecutionProvider"}
# ORT's SkipLayerNormalization CPU kernel took 0.2 ms per 128 x 768 call here, eight times
# LayerNormalization + Add (bert-base forward: 5.2 ms against 0.6 ms + 0.3 ms, see
# BENCHMARKS.md), so its online fusion is switched off; decoding steps are unaffected.
DISABLED_OPTIMIZERS = ["SkipLayerNormFusion"]
ORT_DTYPES = {"tensor(int64)": np.int64, "tensor(float)": np.float32,
              "tensor(float16)": np.float16}
FLOAT_TYPES = ("tensor(float)", "tensor(float16)")
# ORT's own logger prints multi-line errors (e.g. a CUDA library it cannot load) before we can
# report them in one line; every failure it logs is raised to us and reported by us.
ort.set_default_logger_severity(4)


class OrtError(ZooError):
    """ONNX Runtime could not load or run a graph, or a feed does not fit it."""


# A graph of one fp32 Identity ([1] -> [1], opset 18, IR 10), serialized: the probe of whether
# CUDA really runs, without onnx to build it (export/bench/machine.py's one_node_model makes
# the same bytes; tests/house/test_torch_free.py checks it).
IDENTITY_PROBE = (b'\x08\n:>\n\x10\n\x01x\x12\x01y"\x08Identity\x12\x08identityZ\x0f\n\x01x\x12\n'
                  b'\n\x08\x08\x01\x12\x04\n\x02\x08\x01b\x0f\n\x01y\x12\n\n\x08\x08\x01\x12\x04\n\x02\x08\x01'
                  b'B\x04\n\x00\x10\x12')


def cuda_active() -> bool:
    """True only where a CUDA session really runs on CUDA (not merely listed)."""
    if PROVIDERS["cuda"] not in ort.get_available_providers():
        return False
    options = ort.SessionOptions()
    options.log_severity_level = 4
    try:
        session = ort.InferenceSession(IDENTITY_PROBE, options,
                                       providers=[PROVIDERS["cuda"]])
    except Exception:  # noqa: BLE001 - any failure means "not active"
        return False
    return session.get_providers()[0] == PROVIDERS["cuda"]


def require_provider(provider: str) -> None:
    """Refuse an unknown provider, or CUDA where it would not really run, before any work."""
    if provider not in PROVIDERS:
        raise OrtError(f"--provider {provider}: expected one of {', '.join(PROVIDERS)}")
    if provider == "cuda" and not cuda_active():
        raise OrtError(f"--provider cuda: asked for {PROVIDERS['cuda']} but ONNX Runtime runs "
                       f"{PROVIDERS['cpu']} (CUDA is not active here: check the CUDA and cuDNN "
                       "libraries)")


def session_options(threads: int | None = None, profile_prefix: str | None = None
                    ) -> ort.SessionOptions:
    """Options for speed: every graph optimisation (fusions, constant folding, layout), one
    sequential executor whose intra-op pool has `threads` threads (ORT's default: one per
    physical core), and the CPU arena with memory patterns so that repeated runs of one shape
    reuse their buffers instead of allocating."""
    options = ort.SessionOptions()
    options.log_severity_level = 3
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    options.enable_cpu_mem_arena = True
    options.enable_mem_pattern = True
    options.inter_op_num_threads = 1  # sequential executor: a second pool would only idle
    if threads:
        options.intra_op_num_threads = threads
    if profile_prefix:
        options.enable_profiling = True
        options.profile_file_prefix = profile_prefix
    return options


def lean_session_options(threads: int | None = None) -> ort.SessionOptions:
    """session_options for a model whose weights fill most of the machine's memory (the check
    of an export past a gigabyte): ONNX Runtime maps the external data file, where prepacking
    would copy every MatMul's weights into packed form beside the mapped pages, and the arena
    would keep the largest run's buffers (a 262k vocabulary's logits) once it is done. The
    kernels are the same; B is packed per call instead of once."""
    options = session_options(threads)
    options.enable_cpu_mem_arena = False
    options.add_session_config_entry("session.disable_prepacking", "1")
    return options


class Graph:
    """One ONNX file in one InferenceSession."""

    def __init__(self, path: Path, provider: str, threads: int | None = None,
                 options: ort.SessionOptions | None = None) -> None:
        if provider not in PROVIDERS:
            raise OrtError(f"--provider {provider}: expected one of {', '.join(PROVIDERS)}")
        self.path = path
        self.provider = provider
        options = options or session_options(threads)
        wanted = [PROVIDERS[provider]]
        try:
            self.session = ort.InferenceSession(str(path), options, providers=wanted,
                                                disabled_optimizers=DISABLED_OPTIMIZERS)
        except Exception as exc:  # ORT raises its own exception types; report one line
            raise OrtError(f"{display_path(path)}: ONNX Runtime cannot load it: "
                           f"{first_line(exc)}") from exc
        active = self.session.get_providers()
        if active[0] != PROVIDERS[provider]:
            raise OrtError(
                f"{display_path(path)}: asked for {PROVIDERS[provider]} but ONNX Runtime runs "
                f"{active[0]} (CUDA is not active here: check the CUDA and cuDNN libraries)"
            )
        self.inputs = {i.name: i for i in self.session.get_inputs()}
        # inputs with a default (an --adapters keep export's zero factors): fed or not
        self.defaults = {i.name: i for i in self.session.get_overridable_initializers()}
        self.output_names = [o.name for o in self.session.get_outputs()]

    def check_feeds(self, feeds: dict[str, np.ndarray]) -> None:
        where = display_path(self.path)
        missing = [name for name in self.inputs if name not in feeds]
        unexpected = [name for name in feeds if name not in self.inputs
                      and name not in self.defaults]
        if missing or unexpected:
            raise OrtError(f"{where}: feeds do not match the inputs: missing "
                                f"{missing or 'none'}, unexpected {unexpected or 'none'}")
        for name, value in feeds.items():
            spec = self.inputs.get(name) or self.defaults[name]
            dtype = ORT_DTYPES.get(spec.type)
            if not isinstance(value, np.ndarray) or (dtype and value.dtype != dtype):
                found = value.dtype if isinstance(value, np.ndarray) else type(value).__name__
                raise OrtError(f"{where}: input {name} should be {np.dtype(dtype).name} "
                                    f"array, got {found}")
            if value.ndim != len(spec.shape):
                raise OrtError(f"{where}: input {name} should have rank {len(spec.shape)} "
                                    f"{spec.shape}, got shape {list(value.shape)}")
            for axis, (want, got) in enumerate(zip(spec.shape, value.shape, strict=True)):
                if isinstance(want, int) and want != got:
                    raise OrtError(f"{where}: input {name} axis {axis} should be {want}, "
                                        f"got {got}")

    def in_graph_dtypes(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Float feeds in the float type the graph takes (a float16 export's cache and
        encoder states): callers hand float32 or what the graph gave them back."""
        converted = dict(feeds)
        for name, value in feeds.items():
            spec = self.inputs.get(name)
            if (spec is not None and spec.type in FLOAT_TYPES and isinstance(value, np.ndarray)
                    and value.dtype in (np.float32, np.float16)):
                converted[name] = value.astype(ORT_DTYPES[spec.type], copy=False)
        return converted

    def run(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """The outputs by name; a float16 export's outputs in float32 for the caller's
        arithmetic, except the cache (CACHE_OUTPUT), handed back as the graph will take it."""
        feeds = self.in_graph_dtypes(feeds)
        self.check_feeds(feeds)
        outputs = self._run(feeds)
        return {name: value.astype(np.float32) if value.dtype == np.float16
                and not name.startswith(CACHE_OUTPUT) else value
                for name, value in outputs.items()}

    def _run(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        if self.provider == "cuda":  # bind so outputs are produced on the device, copied once
            binding = self.session.io_binding()
            for name, value in feeds.items():
                binding.bind_cpu_input(name, value)
            for name in self.output_names:
                binding.bind_output(name, "cuda")
            self.session.run_with_iobinding(binding)
            return dict(zip(self.output_names, binding.copy_outputs_to_cpu(), strict=True))
        try:
            outputs = self.session.run(None, feeds)
        except Exception as exc:  # ORT raises its own exception types; report one line
            raise OrtError(f"{display_path(self.path)}: ONNX Runtime failed to run it: "
                           f"{first_line(exc)}") from exc
        return dict(zip(self.output_names, outputs, strict=True))


class Runtime:
    """An exported folder opened with ONNX Runtime: one Graph per ONNX file, looked up by its
    contract name (`run("onnx/model.onnx", ...)` runs a quantized export's
    onnx/model_q4.onnx). Opened through runtime/opening.py's open_export, which reads the
    manifest; the family's spec is resolved here, once. `family`: export's Family, where
    export/opening.py opened it for the exporter's checks and benchmarks."""

    def __init__(self, folder: Path, manifest: dict[str, Any], card: Card,
                 provider: str = "cpu", threads: int | None = None, family: Any = None,
                 options: ort.SessionOptions | None = None) -> None:
        self.folder = Path(folder)
        self.manifest = manifest
        self.card = card
        self.spec = spec_of(card)
        self.family = family
        self.provider = provider
        graphs = self.manifest.get("graphs", {})
        if not graphs:
            raise OrtError(f"{display_path(self.folder)}: manifest lists no graphs")
        self.threads = threads
        self.options = options  # every graph's, where given (else session_options(threads))
        # By contract name: a quantized export stores its client graphs under dtype names.
        self.graphs = {name: Graph(self.folder / file, provider, threads, options)
                       for name, file in stored_files(manifest).items()}
        self._kv_graph: Graph | None = None
        # `zoo export --adapters keep`: fed to every graph that takes them, unless given
        self.adapters = Adapters(self.folder, manifest)
        # the clients' layout (manifest `layout`): opened on first use, by its checks alone;
        # {contract name: file}, as for the graphs (quantized, under dtype names)
        self.layout_files = stored_files({
            **{entry: manifest.get(entry) for entry in RENAMING_ENTRIES},
            "graphs": manifest.get(LAYOUT, {}).get("graphs", {})})

    @property
    def kv_graph(self) -> Graph | None:
        """The shared-cache decoding graph of an `--optimize` export (opened on first use, so
        parity and encoders never pay for it); None where the export has none, or on CUDA,
        where its GroupQueryAttention runs only in fp16."""
        entry = self.manifest.get("generation")
        if not entry or self.provider != "cpu":
            return None
        if self._kv_graph is None:
            self._kv_graph = Graph(self.folder / entry["file"], self.provider, self.threads,
                                   self.options)
        return self._kv_graph

    def run(self, file: str, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        if file not in self.graphs and file in self.layout_files:
            self.graphs[file] = Graph(self.folder / self.layout_files[file], self.provider,
                                      self.threads, self.options)
        if file not in self.graphs:  # a manifest that lists less than its family runs
            raise OrtError(f"{display_path(self.folder)}: {file} is not among the graphs "
                           f"{MANIFEST} lists")
        graph = self.graphs[file]
        if self.adapters.inputs and self.adapters.inputs[0] in graph.defaults \
                and self.adapters.inputs[0] not in feeds:
            batch = len(feeds.get("input_ids", next(iter(feeds.values()))))  # its rows
            feeds = {**feeds, **self.adapters.feeds(batch=batch)}
        return graph.run(feeds)
