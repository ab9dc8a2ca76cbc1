"""ONNX export of zoo models, by concern (docs/architecture.md):

- families/  one object per family: its graphs, parity cases, sessions, cost and benchmarks
- onnx/      writing graphs: the contract, trace wrappers, writer, files, manifest, variants
- runtime/   running them: ONNX Runtime sessions, the PyTorch engine, generation, encoding
- checks/    proving them: the parity grid, the quantized agreement check, verify()
- bench/     measuring them: `zoo bench`
- pipeline.py  export + verify, what `zoo export` runs
"""
