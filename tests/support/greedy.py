"""Greedy decoding references: loops written here over PyTorch (the zoo's own model or
transformers') that the tests compare the exports' tokens with."""

from __future__ import annotations

from pathlib import Path

import torch

from zoo.files.weights import load_built


def torch_greedy(folder: Path, prompt: list[int], steps: int) -> list[int]:
    """Argmax of the last position, the whole sequence run again each step."""
    return model_greedy(load_built(folder)[0], prompt, steps)


def model_greedy(model: torch.nn.Module, prompt: list[int], steps: int) -> list[int]:
    """torch_greedy of a model in hand."""
    ids = list(prompt)
    with torch.no_grad():
        for _ in range(steps):
            tensor = torch.tensor([ids])
            logits, _ = model(tensor, torch.ones_like(tensor))
            ids.append(int(logits[0, -1].argmax()))
    return ids[len(prompt):]


def until_eos(ids: list[int], eos: int) -> list[int]:
    """Tokens as a client returns them: up to and including the first eos."""
    return ids[: ids.index(eos) + 1] if eos in ids else ids


def padded(prompts: list[list[int]], pad: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The prompts left-padded as the zoo pads them (runtime.generate.left_padded): ids, mask."""
    from runtime.generate import left_padded

    ids, mask = left_padded(prompts, pad)
    return torch.from_numpy(ids), torch.from_numpy(mask)


def transformers_greedy(reference: torch.nn.Module, prompts: list[list[int]], steps: int,
                        eos: int | None = None, *, every_step: bool = False) -> list[list[int]]:
    """transformers' `generate` greedy tokens on the left-padded prompts, as the zoo gives them:
    `steps` a row, a row that ended padded with eos after its first. `every_step`: no row ends
    (min_new_tokens=steps), so the whole run is compared whatever the model's eos."""
    ids, mask = padded(prompts, 0)
    options = (dict(min_new_tokens=steps, pad_token_id=0) if every_step
               else dict(eos_token_id=eos, pad_token_id=0 if eos is None else eos))
    with torch.no_grad():
        out = reference.generate(input_ids=ids, attention_mask=mask, do_sample=False,
                                 max_new_tokens=steps, **options)
    rows = out[:, ids.shape[1]:].tolist()
    return [row + [eos] * (steps - len(row)) for row in rows]  # all rows ended: fewer columns


def templated_prompt(tokenizer: object, messages: list[dict], template: str) -> list[int]:
    """transformers' `apply_chat_template` ids for `messages`, ending where the reply begins
    (a reference for the zoo's own renderer)."""
    rendered = tokenizer.apply_chat_template(messages, chat_template=template,  # type: ignore[attr-defined]
                                             add_generation_prompt=True, tokenize=True,
                                             return_dict=True)
    return list(rendered["input_ids"])
