"""Running an export with ONNX Runtime, numpy and tokenizers alone (no torch, no exporter):
sessions, decoding, sampling, generation, sentence vectors and labels, corpus jobs, prompts,
tokenizers and data files, and reading a manifest. The layer under zoo/ and export/, over
registry/ (docs/architecture.md)."""
