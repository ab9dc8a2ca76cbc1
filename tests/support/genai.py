"""ONNX Runtime GenAI's own greedy loop over an export (the reference of the decoder tests that run
in GenAI)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from export.targets.genai import GENAI_CONFIG, genai_batch
from runtime.generate import left_padded
from tests.support.greedy import until_eos

og = pytest.importorskip("onnxruntime_genai")


def genai_greedy(folder: Path, prompts: list[list[int]], new_tokens: int,
                 left: bool = False) -> list[list[int]]:
    """GenAI's own loop on a batch padded as `genai_batch` pads it (on the right with
    pad_token_id), or `left`-padded as the zoo pads (what GenAI does not read as padding)."""
    config = json.loads((folder / GENAI_CONFIG).read_text())["model"]
    rows = left_padded(prompts, config["pad_token_id"])[0].astype(np.int32) if left else \
        genai_batch(folder, prompts)
    width = rows.shape[1]
    model = og.Model(str(folder))
    params = og.GeneratorParams(model)
    params.set_search_options(max_length=width + new_tokens, batch_size=len(prompts),
                              do_sample=False)
    generator = og.Generator(model, params)
    generator.append_tokens(rows)
    while not generator.is_done():
        generator.generate_next_token()
    return [until_eos(generator.get_sequence(i)[width:].tolist(), config["eos_token_id"])
            for i in range(len(prompts))]
