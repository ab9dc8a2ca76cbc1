"""Writing ONNX graphs: the contract, trace wrappers, the writer, files, manifest, variants."""
