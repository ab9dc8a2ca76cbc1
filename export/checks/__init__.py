"""Proving exports: the parity grid, the quantized agreement check, and verify()."""
