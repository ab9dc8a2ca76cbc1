"""Shared fixtures: the shipped cards, by name, and small helpers for random inputs."""

from __future__ import annotations

import pytest
import torch

from registry import Card, open_catalog

CATALOG = open_catalog()
ALL_CARDS = CATALOG.names()
TINY_CARDS = CATALOG.names("*-tiny")
FULL_CARDS = [name for name in ALL_CARDS if name not in TINY_CARDS]


def card(name: str, **overrides: object) -> Card:
    return CATALOG.get(name, overrides or None)


def random_ids(card: Card, batch: int, length: int, seed: int = 0) -> torch.Tensor:
    """Ids that avoid the special tokens below 3 and the pad token."""
    generator = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, card["vocab_size"], (batch, length), generator=generator)
    return ids.masked_fill(ids == card["pad_token_id"], 3)


@pytest.fixture(params=TINY_CARDS)
def tiny_card(request: pytest.FixtureRequest) -> Card:
    return card(request.param)


def count_module_parameters(model: torch.nn.Module) -> int:
    return sum(parameter.numel() for parameter in model.parameters())


def prompt_feeds(card: Card, ids: list[int]) -> dict:
    """Feeds for a decoder's model.onnx: the whole prompt, unpadded, with an empty cache."""
    import numpy as np

    source = np.array([ids], np.int64)
    heads = card["n_heads"]
    empty = np.zeros((1, heads, 0, card["d_model"] // heads), np.float32)
    return {"input_ids": source, "attention_mask": np.ones_like(source),
            "position_ids": np.arange(len(ids))[None],
            **{f"past_key_values.{i}.{kv}": empty for i in range(card["n_layers"])
               for kv in ("key", "value")}}


def modules_loaded(calls: list[list[str]], roots: tuple[str, ...]) -> list[str]:
    """The modules under `roots` that running the CLI with each argument list loads, in a
    fresh interpreter (so nothing a test imported here counts)."""
    import json
    import os
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    script = (f"import json, sys\nfrom cli import main\nfor args in {calls!r}:\n"
              "    try:\n        main(args, standalone_mode=False)\n"
              "    except SystemExit:\n        pass\n"
              f"print(json.dumps(sorted(m for m in sys.modules "
              f"if m.split('.')[0] in {roots!r})))\n")
    env = {**os.environ, "PYTHONPATH": str(root)}
    env.pop("ZOO_PATH", None)
    done = subprocess.run([sys.executable, "-c", script], cwd=root, env=env,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.splitlines()[-1])
