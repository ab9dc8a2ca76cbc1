"""The zoo's Python API: one stable root for what the commands do.

    import zoo

    zoo.export_model("gpt-tiny", "gpt-tiny-onnx", zoo.ExportOptions(optimize=True))
    model = zoo.load("gpt-tiny-onnx")                     # ONNX Runtime only: no torch
    model.generate("ROMEO:", zoo.GenerateOptions(max_new_tokens=20))[0].text
    zoo.load("embedder-onnx").embed(["a text", "another"])  # (2, d) sentence vectors
    zoo.load("classifier-onnx").classify("a text")[0]       # {label: probability}
    module = zoo.build("gpt-tiny", seed=0, sets={"n_layers": 4})  # a torch nn.Module

Each name is imported on first use (PEP 562), so `import zoo` loads nothing heavy and
`zoo.load` never loads torch or the exporter. The modules behind the names may move; these
names stay. A bad option raises ZooError with the message the command line prints.
"""

from __future__ import annotations

from importlib import import_module

# name -> the module that defines it (runtime/ runs exports; export/ makes them; zoo/ builds)
_NAMES = {
    "load": "runtime.exported",
    "Exported": "runtime.exported",
    "Generated": "runtime.exported",
    "GenerateOptions": "runtime.exported",
    "export_model": "export.api",
    "ExportOptions": "export.options",
    "build": "zoo.files.sources",
    "ZooError": "registry.errors",
}

__all__ = ["ExportOptions", "Exported", "GenerateOptions", "Generated", "ZooError",
           "__version__", "build", "export_model", "load"]


def __getattr__(name: str) -> object:
    if name == "__version__":
        from importlib.metadata import PackageNotFoundError, version

        try:
            return version("zoo")
        except PackageNotFoundError:  # a checkout on sys.path, not installed
            return "0+unknown"
    if name not in _NAMES:
        raise AttributeError(f"module 'zoo' has no attribute {name!r}")
    value = getattr(import_module(_NAMES[name]), name)
    globals()[name] = value  # looked up once
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
