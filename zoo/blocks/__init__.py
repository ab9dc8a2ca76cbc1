"""Shared blocks: attention, feed-forward, norms, positions, embeddings, heads."""
