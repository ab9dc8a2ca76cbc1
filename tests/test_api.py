"""The public Python API (`import zoo`, zoo/__init__.py; README "Python API"), used as a program
would use it: nothing from export/ but what `zoo` names. Expected values come from PyTorch
directly (a greedy loop over the full sequence, no cache) and from the sentence-vector formula
written out in tests/test_embeddings.py."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import torch

from tests.conftest import BERT_CLASSIFIER, CLASSIFIER_SEED, ON_CLASSIFIER, ON_TRAINED
from tests.test_embeddings import PROMPTS, reference
from zoo import ExportOptions, GenerateOptions, ZooError, export_model, load
from zoo.files.weights import load_built

NEW_TOKENS = 6


def torch_greedy(folder: Path, prompt: list[int], steps: int) -> list[int]:
    """Argmax of the last position, the whole sequence run again each step."""
    model, _ = load_built(folder)
    ids = list(prompt)
    with torch.no_grad():
        for _ in range(steps):
            tensor = torch.tensor([ids])
            logits, _ = model(tensor, torch.ones_like(tensor))
            ids.append(int(logits[0, -1].argmax()))
    return ids[len(prompt):]


@pytest.fixture(scope="module")
def trained_export(trained_gpt_tiny: Callable[[], Path], tmp_path_factory: pytest.TempPathFactory
                   ) -> Path:
    out = tmp_path_factory.mktemp("api") / "gpt-tiny-onnx"
    report = export_model(trained_gpt_tiny(), out, ExportOptions())
    assert report.passed
    return out


@ON_TRAINED
def test_generate_from_ids_and_text_gives_pytorchs_greedy_tokens(trained_export: Path) -> None:
    model = load(trained_export)
    prompts = [[82, 79, 77, 69, 79, 58], [87, 104]]  # "ROMEO:" and "Wh": a left-padded batch
    options = GenerateOptions(max_new_tokens=NEW_TOKENS)
    generated = model.generate(prompts, options)
    for prompt, row in zip(prompts, generated, strict=True):
        assert row.prompt == prompt
        assert row.ids == torch_greedy(trained_export, prompt, NEW_TOKENS)
    from_text = model.generate("ROMEO:", options)[0]
    assert from_text.ids == generated[0].ids  # the byte tokenizer reads the text as the ids
    assert from_text.text == bytes(t for t in generated[0].ids if t < 256).decode(
        "utf-8", errors="replace")


@ON_TRAINED
def test_sampling_options_are_the_command_lines(trained_export: Path) -> None:
    model = load(trained_export)
    sampled = GenerateOptions(max_new_tokens=NEW_TOKENS, temperature=1.5, top_k=20, seed=3)
    first = model.generate("ROMEO:", sampled)[0].ids
    assert model.generate("ROMEO:", sampled)[0].ids == first  # seeded: the same draw again
    greedy = model.generate("ROMEO:", GenerateOptions(max_new_tokens=NEW_TOKENS))[0].ids
    others = [model.generate("ROMEO:", GenerateOptions(NEW_TOKENS, 1.5, 20, seed=seed))[0].ids
              for seed in range(4, 8)]
    assert any(ids != greedy for ids in [first, *others])  # the temperature is applied


@ON_TRAINED
def test_bad_input_is_a_zoo_error_with_the_command_lines_words(trained_export: Path,
                                                               tmp_path: Path) -> None:
    model = load(trained_export)
    with pytest.raises(ZooError, match=r"token id 300 is not in the vocabulary \(token ids "
                       r"should be in 0\.\.259\)"):
        model.generate([[1, 300]])
    with pytest.raises(ZooError, match="an empty prompt"):
        model.generate("")
    with pytest.raises(ZooError, match="no sentence vector"):
        model.embed("ROMEO:")
    with pytest.raises(ZooError, match="not an export"):
        load(tmp_path)


@ON_CLASSIFIER
def test_embed_and_classify_are_the_formula_on_each_prompt_alone(classifier_export: Path) -> None:
    vectors, probabilities = reference("bert-tiny", BERT_CLASSIFIER, CLASSIFIER_SEED)
    model = load(classifier_export)
    np.testing.assert_allclose(model.embed(PROMPTS), vectors, atol=1e-5, rtol=0)
    labels = BERT_CLASSIFIER["labels"]
    for row, scores in enumerate(model.classify(PROMPTS)):
        assert list(scores.values()) == sorted(scores.values(), reverse=True)
        expected = dict(zip(labels, probabilities[row], strict=True))
        assert scores == pytest.approx(expected, abs=1e-5)
    one = model.classify(PROMPTS[1])
    assert len(one) == 1 and one[0] == pytest.approx(model.classify(PROMPTS)[1], abs=1e-6)
    with pytest.raises(ZooError, match="does not generate"):
        model.generate(PROMPTS[0])
