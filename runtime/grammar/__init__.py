"""Constrained decoding: JSON schemas, regular expressions and tool calls enforced at every
step by a grammar engine (llguidance) over the export's own tokenizer."""
