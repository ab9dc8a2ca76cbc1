"""The public Python API (`import zoo`, zoo/__init__.py; README "Python API"), used as a program
would use it: nothing from export/ but what `zoo` names. Expected values come from PyTorch
directly (a greedy loop over the full sequence, no cache) and from the sentence-vector formula
written out in tests/runtime/test_embeddings.py."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import torch

from tests.conftest import BERT_CLASSIFIER, CLASSIFIER_SEED, ON_CLASSIFIER, ON_TRAINED
from tests.support.embeddings import PROMPTS, reference
from tests.support.greedy import torch_greedy
from zoo import ExportOptions, GenerateOptions, ZooError, export_model, load

NEW_TOKENS = 6


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


def test_build_makes_the_card_with_its_fields_set_and_its_seed() -> None:
    """`zoo.build` is `zoo build`'s module: the card's fields with `sets` applied (validated
    as --set is), initialised from the seed."""
    import zoo
    from registry import open_catalog, total_parameters

    model = zoo.build("gpt-tiny", seed=3, sets={"n_layers": 1, "d_ff": 96})
    changed = open_catalog().get("gpt-tiny", {"n_layers": 1, "d_ff": 96})
    assert len(model.layers) == 1 and not model.training  # the registry's arithmetic:
    assert sum(p.numel() for p in model.parameters()) == total_parameters(changed.fields)
    same = zoo.build("gpt-tiny", seed=3, sets={"n_layers": 1, "d_ff": 96}).state_dict()
    other = zoo.build("gpt-tiny", seed=4, sets={"n_layers": 1, "d_ff": 96}).state_dict()
    weights = model.state_dict()
    assert all(torch.equal(weights[name], same[name]) for name in weights)
    assert not all(torch.equal(weights[name], other[name]) for name in weights)
    with pytest.raises(ZooError, match="n_layers"):
        zoo.build("gpt-tiny", sets={"n_layers": 0})
    with pytest.raises(ZooError, match="sets= applies to a card name"):
        zoo.build(open_catalog().get("gpt-tiny"), sets={"n_layers": 1})


def test_the_old_path_and_the_version_are_zoos() -> None:
    """`export.api` names the same objects for one release; `zoo.__version__` is the
    installed distribution's."""
    from importlib.metadata import version

    import export.api
    import zoo

    assert all(getattr(export.api, name) is getattr(zoo, name) for name in
               ("load", "export_model", "ExportOptions", "GenerateOptions", "ZooError"))
    assert zoo.__version__ == version("zoo")
    with pytest.raises(AttributeError, match="no attribute 'lod'"):
        zoo.lod  # noqa: B018
