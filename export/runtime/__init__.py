"""The PyTorch engine (engines.py): a model behind the interface runtime/engine.py declares."""
