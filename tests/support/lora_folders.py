"""LoRA folders for the kept-adapter tests: a card's base (seed 0) with adapters whose B is far
from zero (a trained adapter's B after a few steps is too small to change a greedy token),
saved as `zoo train --lora` saves them; and greedy references in PyTorch."""

from __future__ import annotations

from pathlib import Path

import torch

from tests.conftest import card
from tests.support.greedy import model_greedy
from zoo.assemble import build_model
from zoo.blocks.lora import adapters, add_adapters
from zoo.files.peft_adapter import save_adapted
from zoo.files.sources import load_folder
from zoo.files.weights import CONFIG, card_yaml

TARGETS = ("query", "value", "down")


def adapted_folder(name: str, out: Path, seed: int, rank: int,
                   targets: tuple[str, ...] = TARGETS) -> Path:
    """OUT as `zoo train NAME --lora RANK` leaves it: the base's weights, PEFT's adapter."""
    model = build_model(card(name), seed=0)
    add_adapters(model, targets, rank, alpha=2.0 * rank)  # the scale 2: folded into B
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for layer in adapters(model).values():
            layer.lora_B.weight.copy_(0.1 * torch.randn(layer.lora_B.weight.shape,
                                                  generator=generator))
    out.mkdir(parents=True)
    save_adapted(model, card(name), out)
    (out / CONFIG).write_text(card_yaml(card(name)), encoding="utf-8")
    return out


def merged_greedy(folder: Path, prompt: list[int], steps: int) -> list[int]:
    """Greedy tokens of the folder's model with its adapter merged into the weights (its
    merged export's tokens), the whole sequence run again each step."""
    return model_greedy(load_folder(folder)[0], prompt, steps)
