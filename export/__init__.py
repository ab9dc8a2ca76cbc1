"""The exporter: torch models to ONNX, proved and measured (docs/architecture.md):

- api.py, pipeline.py, commands.py  `export_model`; export + verify; `zoo export/parity/triton`
- family.py, families/  one object per family: its graphs, wrappers, parity cases, checks, extras
- onnx/      writing graphs: trace, forms, writer, files, weights, manifest, the variants
- checks/    proving them: the parity grid, float16, agreement, the quality gate, verify()
- targets/   the files other runtimes read: GenAI, Hugging Face, tokenizers, seq2seq, Triton
- opening.py, torch_engine.py  an export or a model opened, its family resolved once
- bench/     `zoo bench`: per family, registered against the family spec
- inspect/   `zoo attention`: maps per family, registered against the family spec
"""
