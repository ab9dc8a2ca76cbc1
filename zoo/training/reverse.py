"""The word-reversal task: a sequence-to-sequence job beyond copying, from the shipped text.

The vocabulary is the text's most frequent lowercase words (ids from 3; 0-2 are pad, bos and
eos); the text becomes the stream of its words in that vocabulary, others dropped. A sample is
a run of 3 to 8 consecutive words of the stream, and the target is the same words in reverse
order, so the decoder has to read the source from its end: what it learns is an order, not a
copy. The first 90% of the stream trains; runs from the last 10% are held out.
"""

from __future__ import annotations

import re
from collections import Counter
from functools import lru_cache
from pathlib import Path

import torch

from runtime.files.tokenizer import WordTokenizer
from zoo.training.datasets import SHIPPED_TEXT

SPECIALS = 3  # pad 0, bos 1, eos 2
SHORTEST, LONGEST = 3, 8
TRAIN_SHARE = 0.9


def words_of(text: str) -> list[str]:
    return re.findall(r"[a-z]+", text.lower())


@lru_cache(maxsize=4)
def vocabulary(vocab_size: int, path: Path = SHIPPED_TEXT) -> WordTokenizer:
    """The vocab_size - 3 most frequent words (ties broken alphabetically, so it is stable)."""
    counts = Counter(words_of(path.read_text(encoding="utf-8")))
    ranked = sorted(counts, key=lambda word: (-counts[word], word))
    return WordTokenizer(ranked[: vocab_size - SPECIALS])


@lru_cache(maxsize=4)
def stream(vocab_size: int, path: Path = SHIPPED_TEXT) -> tuple[torch.Tensor, torch.Tensor]:
    """(training ids, held-out ids): the text's known words as ids, split 90/10."""
    tokenizer = vocabulary(vocab_size, path)
    known = [tokenizer.index[w] for w in words_of(path.read_text(encoding="utf-8"))
             if w in tokenizer.index]
    cut = int(len(known) * TRAIN_SHARE)
    return torch.tensor(known[:cut]), torch.tensor(known[cut:])


def pairs(ids: torch.Tensor, lengths: list[int], starts: list[int]
          ) -> list[tuple[list[int], list[int]]]:
    return [(ids[s:s + n].tolist(), ids[s:s + n].flip(0).tolist())
            for s, n in zip(starts, lengths, strict=True)]


def reverse_batch(vocab_size: int, batch_size: int, bos: int, eos: int, pad: int,
                  generator: torch.Generator) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
    """(inputs, labels) for one training step: right-padded sources with their mask, the
    reversed words after the start token, eos after them, padding ignored (-100)."""
    train_ids, _ = stream(vocab_size)
    lengths = torch.randint(SHORTEST, LONGEST + 1, (batch_size,), generator=generator).tolist()
    starts = torch.randint(0, len(train_ids) - LONGEST, (batch_size,),
                           generator=generator).tolist()
    source = torch.full((batch_size, LONGEST), pad)
    mask = torch.zeros((batch_size, LONGEST), dtype=torch.long)
    decoder = torch.full((batch_size, LONGEST + 1), pad)
    labels = torch.full((batch_size, LONGEST + 1), -100)
    for row, (words, reversed_words) in enumerate(pairs(train_ids, lengths, starts)):
        n = len(words)
        source[row, :n], mask[row, :n] = torch.tensor(words), 1
        decoder[row, : n + 1] = torch.tensor([bos, *reversed_words])
        labels[row, : n + 1] = torch.tensor([*reversed_words, eos])
    return {"input_ids": source, "attention_mask": mask, "decoder_input_ids": decoder}, labels


def held_out(vocab_size: int, count: int) -> list[tuple[list[int], list[int]]]:
    """`count` (source, target) pairs from the held-out part, lengths cycling 3..8, one after
    another without overlap."""
    _, ids = stream(vocab_size)
    lengths = [SHORTEST + i % (LONGEST - SHORTEST + 1) for i in range(count)]
    starts = [sum(lengths[:i]) for i in range(count)]
    if starts[-1] + lengths[-1] > len(ids):
        raise ValueError(f"only {len(ids)} held-out words")
    return pairs(ids, lengths, starts)
