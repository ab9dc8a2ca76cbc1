"""A tiny CLIP as transformers makes it: the config, a byte-level CLIP tokenizer (518 tokens:
each byte alone and word-final, four merges, the start and end tokens last), CLIP's image
processor at 32 pixels, and a random CLIPModel folder with all three (tests/imports/test_clip.py,
tests/clients/test_transformers_js_clip.py). transformers is imported by the caller's check."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from tokenizers.pre_tokenizers import ByteLevel

from tests.support.hf_decoders import randomise

BYTES = sorted(ByteLevel.alphabet())
MERGES = [("c", "a"), ("ca", "t</w>"), ("d", "o"), ("do", "g</w>")]
VOCAB = [*BYTES, *(f"{byte}</w>" for byte in BYTES), "ca", "cat</w>", "do", "dog</w>",
         "<|startoftext|>", "<|endoftext|>"]
END = len(VOCAB) - 1  # the end token (and padding, as CLIP's tokenizer pads)
TEXT = dict(vocab_size=len(VOCAB), hidden_size=32, num_attention_heads=4, num_hidden_layers=2,
            intermediate_size=64, max_position_embeddings=16, bos_token_id=END - 1,
            eos_token_id=END, pad_token_id=END)
VISION = dict(hidden_size=48, num_attention_heads=4, num_hidden_layers=2, intermediate_size=96,
              image_size=32, patch_size=8)


def tiny_config() -> Any:
    import transformers

    return transformers.CLIPConfig(text_config=TEXT, vision_config=VISION, projection_dim=24)


def tiny_tokenizer() -> Any:
    import transformers

    return transformers.CLIPTokenizer(vocab={token: i for i, token in enumerate(VOCAB)},
                                      merges=MERGES)


def tiny_processor() -> Any:
    """CLIP's settings (bicubic, OpenAI's mean and std) at the tiny model's 32 pixels."""
    import transformers

    return transformers.CLIPImageProcessorPil(size={"shortest_edge": 32},
                                              crop_size={"height": 32, "width": 32})


def tiny_clip_folder(folder: Path) -> torch.nn.Module:
    """A random CLIPModel saved to `folder` with its tokenizer and processor, every tensor far
    from its init (a norm or bias mapped wrong shows), logit_scale kept near CLIP's so the
    logits stay in range; returns the model."""
    import transformers

    torch.manual_seed(0)
    model = randomise(transformers.CLIPModel(tiny_config()))
    with torch.no_grad():
        model.logit_scale.fill_(2.0)
    model.save_pretrained(folder)
    tiny_tokenizer().save_pretrained(folder)
    tiny_processor().save_pretrained(folder)
    return model
