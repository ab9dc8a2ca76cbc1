"""Running exports: ONNX Runtime sessions, the PyTorch engine, generation and encoding."""
