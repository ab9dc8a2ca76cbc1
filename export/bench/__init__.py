"""`zoo bench`: PyTorch eager against ONNX Runtime, scaled by the machine's own limits."""
