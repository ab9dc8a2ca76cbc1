"""Training batches for the three tasks, each a pure function of (seed, step, rank).

Drawing every batch from its own seeded generator means an interrupted run that resumes at step
k sees exactly the batches an uninterrupted one would, with no sampler state to save.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from runtime.files.texts import read_token_ids
from runtime.files.tokenizer import ByteTokenizer
from zoo.training.datasets import SHIPPED_TEXT as SHIPPED_TEXT  # re-exported: the lm default

IGNORE = -100  # label for positions that carry no loss


@dataclass
class Batch:
    inputs: dict[str, torch.Tensor]
    labels: torch.Tensor  # (B, T) with IGNORE where no loss
    tokens: int  # tokens processed, for tokens/s


def batch_generator(seed: int, step: int, rank: int) -> torch.Generator:
    return torch.Generator().manual_seed(((seed * 1_000_003) + step) * 1_009 + rank)


def read_text_tokens(path: Path, tokenizer: ByteTokenizer, min_tokens: int) -> torch.Tensor:
    """The whole file as token ids, refusing files that cannot make one batch."""
    return torch.tensor(read_token_ids(path, tokenizer, min_tokens), dtype=torch.long)


def windows(ids: torch.Tensor, batch_size: int, length: int, generator: torch.Generator
            ) -> torch.Tensor:
    starts = torch.randint(0, len(ids) - length + 1, (batch_size,), generator=generator)
    return torch.stack([ids[start:start + length] for start in starts.tolist()])


def lm_batch(ids: torch.Tensor, batch_size: int, block: int, generator: torch.Generator) -> Batch:
    """Next-token prediction: inputs are a window, labels the same window shifted by one."""
    chunk = windows(ids, batch_size, block + 1, generator)
    inputs = chunk[:, :-1]
    return Batch({"input_ids": inputs}, chunk[:, 1:], inputs.numel())


def mlm_batch(ids: torch.Tensor, batch_size: int, block: int, generator: torch.Generator,
              mask_token: int, vocab: int) -> Batch:
    """BERT's masking: 15% of tokens are predicted; of those 80% become the mask token, 10% a
    random token, 10% stay as they are."""
    original = windows(ids, batch_size, block, generator)
    chosen = torch.rand(original.shape, generator=generator) < 0.15
    roll = torch.rand(original.shape, generator=generator)
    inputs = original.clone()
    inputs[chosen & (roll < 0.8)] = mask_token
    randomised = chosen & (roll >= 0.8) & (roll < 0.9)
    inputs[randomised] = torch.randint(0, vocab, (int(randomised.sum()),), generator=generator)
    labels = torch.where(chosen, original, torch.full_like(original, IGNORE))
    return Batch({"input_ids": inputs}, labels, inputs.numel())


def copy_sequences(batch_size: int, length: int, symbols: int, generator: torch.Generator
                   ) -> torch.Tensor:
    """Random symbol sequences over ids 3 .. 3 + symbols - 1 (0-2 are pad, bos, eos)."""
    return torch.randint(3, 3 + symbols, (batch_size, length), generator=generator)


def copy_batch(batch_size: int, length: int, symbols: int, bos: int, eos: int,
               generator: torch.Generator) -> Batch:
    """The synthetic copy task: the decoder reproduces the source after its start token."""
    source = copy_sequences(batch_size, length, symbols, generator)
    start = torch.full((batch_size, 1), bos)
    end = torch.full((batch_size, 1), eos)
    inputs = {"input_ids": source, "decoder_input_ids": torch.cat([start, source], dim=1)}
    return Batch(inputs, torch.cat([source, end], dim=1), 2 * source.numel())
