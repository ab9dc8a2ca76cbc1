"""Serving an export in runtimes outside the zoo: ONNX Runtime GenAI (genai_config.json, written
into every decoder export) and Triton Inference Server (a model repository made from an export
folder). Both are generated from the graphs' own inputs and outputs, so names, dtypes and dims
cannot drift from what the ONNX files hold. How to use them: docs/serving.md."""
