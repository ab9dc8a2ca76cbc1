"""Files in and out: safetensors weights, atomic writes, tokenizers, checkpoint import."""
