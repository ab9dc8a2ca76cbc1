"""Optimum's ORTModelForCausalLM / ORTModelForFeatureExtraction / ORTModelForSequenceClassification
/ ORTModelForMaskedLM (ModernBERT's) and sentence-transformers (`backend="onnx"`) load fresh
`zoo export` folders as they are and agree with `zoo run` on them: the same greedy tokens,
hidden states, MLM logits and sentence vectors within 1e-4, the same labels and probabilities
within 1e-4; ORTModelForSeq2SeqLM (and `pipeline("translation")`) on a translation model (a
MarianMT import, and a T5 v1.1 import): the same source ids (MarianTokenizer on its
sentencepiece files; T5's tokenizer.json with its extra ids), greedy tokens and text.
Quantized exports too,
whose client graphs are stored under transformers.js's dtype names (onnx/model_q4.onnx,
model_quantized.onnx, encoder_model_int8.onnx): Optimum takes the folder's one ONNX file (a
translation model's: the one encoder and merged decoder under onnx/),
sentence-transformers the file its sentence_bert_config.json names.

They run in examples/optimum/.venv (optimum-onnx needs transformers < 4.58), driven by
examples/optimum/run.py in one subprocess. Skips where that environment is missing
(`bash examples/optimum/setup.sh` makes it), except under ZOO_REQUIRE_OPTIMUM=1 (.ci/run makes
it and sets that), where that fails.
"""

from __future__ import annotations

import json
import os
import subprocess
from typing import Any

import numpy as np
import pytest

from export.opening import open_export
from runtime.contract import MODEL_GRAPH
from runtime.encode import encoder_feeds
from tests.conftest import ON_HF_CLIENTS, Lazy
from tests.support.decoder_folders import GEMMA3, QWEN3_MOE, WINDOW
from tests.support.greedy import until_eos
from tests.support.hf_exports import T5, TEXTS, TRANSLATIONS, TRANSLATOR, alone
from tests.support.optimum import PYTHON, RUNNER, require_optimum
from zoo import GenerateOptions, load

STEPS = 24
GENERATORS = ("gpt", "llama", "gpt-q4", GEMMA3, "gpt-fp16", "gpt-q4f16", "gpt-external")
# Qwen3-MoE's head_dim (12) is not hidden_size // num_attention_heads (8): Optimum sizes the
# first step's empty cache by the latter (run.py's causal-lm-head-dim says where)
HEAD_DIM_REFUSED = (QWEN3_MOE,)
CLASSIFIERS = ("classifier", "pooler-classifier", "classifier-q8", "modernbert-classifier",
               "modernbert-classifier-q8")
EMBEDDERS = ("embedder", "embedder-q8", "modernbert-embedder")
MASKED = ("modernbert-embedder",)  # its MLM head's logits beside the sentence vector
TRANSLATORS = (TRANSLATOR, "translator-int8", T5, "t5-int8",  # MarianMT's, T5's
               "translator-fp16")
pytestmark = ON_HF_CLIENTS  # the exports are made once, in this group's worker


@pytest.fixture(scope="module")
def clients(hf_client_exports: Lazy, tmp_path_factory: pytest.TempPathFactory
            ) -> dict[tuple[str, str, str], Any]:
    """{(export key, task, text or ""): what the client gave}, every job in one process."""
    require_optimum()
    jobs = [(key, "causal-lm", text) for key in GENERATORS for text in TEXTS]
    jobs += [(key, task, text) for key in HEAD_DIM_REFUSED
             for task in ("causal-lm", "causal-lm-head-dim") for text in TEXTS]
    jobs += [(key, "feature-extraction", "") for key in EMBEDDERS]
    # one text a job: int8-dynamic's results depend on the batch (tests/support/hf_exports.py:
    # alone)
    jobs += [(key, "sentence-transformers", text) for key in EMBEDDERS for text in TEXTS]
    jobs += [(key, "sequence-classification", "") for key in CLASSIFIERS]
    jobs += [(key, "masked-lm", "") for key in MASKED]
    jobs += [(key, "translation", "") for key in TRANSLATORS]
    spec = [{"folder": str(hf_client_exports[key]), "task": task,
             "texts": [text] if text else [*TRANSLATIONS, *TEXTS] if key in TRANSLATORS else TEXTS,
             "max_new_tokens": STEPS} for key, task, text in jobs]
    path = tmp_path_factory.mktemp("optimum") / "jobs.json"
    path.write_text(json.dumps(spec), encoding="utf-8")
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
           "OMP_NUM_THREADS": "1"}
    result = subprocess.run([str(PYTHON), str(RUNNER), "--jobs", str(path)], env=env,
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    results = json.loads(result.stdout.strip().splitlines()[-1])
    for job, got in zip(jobs, results, strict=True):
        refused = job[0] in HEAD_DIM_REFUSED and job[1] == "causal-lm"  # checked below
        assert "error" not in got or refused, (job, got["error"])
    return dict(zip(jobs, results, strict=True))


@pytest.mark.parametrize("key", GENERATORS)
def test_ort_model_for_causal_lm_gives_zoo_runs_greedy_tokens(
        key: str, clients: dict, hf_client_exports: Lazy) -> None:
    exported = load(hf_client_exports[key])
    for text in TEXTS:
        new = exported.generate([text], GenerateOptions(max_new_tokens=STEPS))[0].ids
        expected = exported.tokenizer.encode(text) + until_eos(new, exported.card["eos_token_id"])
        assert clients[key, "causal-lm", text]["tokens"] == expected, text


def test_the_gemma_3_prompts_reach_past_its_window_and_the_tokens_vary(
        hf_client_exports: Lazy) -> None:
    """What the Gemma 3 case of the test above means: each prompt is longer than the local
    layers' window, and the random model's greedy tokens are not one id repeated."""
    exported = load(hf_client_exports[GEMMA3])
    assert exported.card["sliding_window"] == WINDOW and "L" in exported.card["attention_pattern"]
    assert all(len(exported.tokenizer.encode(text)) > WINDOW for text in TEXTS)
    new = exported.generate(TEXTS, GenerateOptions(max_new_tokens=STEPS))
    assert len({token for row in new for token in row.ids}) > 10


@pytest.mark.parametrize("key", HEAD_DIM_REFUSED)
def test_ort_model_for_causal_lm_sizes_the_cache_by_hidden_size_over_heads(
        key: str, clients: dict, hf_client_exports: Lazy) -> None:
    """Optimum's refusal, not the zoo's: the export's graph and config.json both say head_dim
    12, and ORTModelForCausalLM feeds an empty cache of hidden_size // num_attention_heads = 8
    at the first step. With the cache sized by config.json's head_dim, the tokens are `zoo
    run`'s."""
    exported = load(hf_client_exports[key])
    config = json.loads((hf_client_exports[key] / "config.json").read_text(encoding="utf-8"))
    assert (config["model_type"], config["head_dim"], exported.card["head_dim"]) == (
        "qwen3_moe", 12, 12)
    wrong = config["hidden_size"] // config["num_attention_heads"]
    for text in TEXTS:
        error = clients[key, "causal-lm", text]["error"]
        assert "Got invalid dimensions for input: past_key_values." in error, error
        assert f"index: 3 Got: {wrong} Expected: 12" in error, error
        new = exported.generate([text], GenerateOptions(max_new_tokens=STEPS))[0].ids
        expected = exported.tokenizer.encode(text) + until_eos(new, exported.card["eos_token_id"])
        assert clients[key, "causal-lm-head-dim", text]["tokens"] == expected, text


@pytest.mark.parametrize("key", EMBEDDERS)
def test_ort_model_for_feature_extraction_gives_the_hidden_states(
        key: str, clients: dict, hf_client_exports: Lazy) -> None:
    runtime = open_export(hf_client_exports[key])
    tokenizer = load(hf_client_exports[key]).tokenizer
    got = clients[key, "feature-extraction", ""]["last_hidden_state"]
    for text, states in zip(TEXTS, got, strict=True):
        ids = np.array([tokenizer.encode(text)])
        expected = runtime.run(MODEL_GRAPH, encoder_feeds(runtime.card, ids))["last_hidden_state"]
        np.testing.assert_allclose(np.array(states), expected[0], atol=1e-4, rtol=0)


@pytest.mark.parametrize("key", MASKED)
def test_ort_model_for_masked_lm_gives_the_logits(key: str, clients: dict,
                                                  hf_client_exports: Lazy) -> None:
    runtime = open_export(hf_client_exports[key])
    tokenizer = load(hf_client_exports[key]).tokenizer
    got = clients[key, "masked-lm", ""]["logits"]
    for text, logits in zip(TEXTS, got, strict=True):
        ids = np.array([tokenizer.encode(text)])
        expected = runtime.run(MODEL_GRAPH, encoder_feeds(runtime.card, ids))["logits"]
        np.testing.assert_allclose(np.array(logits), expected[0], atol=1e-4, rtol=0)


@pytest.mark.parametrize("key", EMBEDDERS)
def test_sentence_transformers_gives_the_sentence_embedding(
        key: str, clients: dict, hf_client_exports: Lazy) -> None:
    expected = np.vstack(alone(load(hf_client_exports[key]).embed))
    got = np.vstack([clients[key, "sentence-transformers", text]["vectors"] for text in TEXTS])
    np.testing.assert_allclose(got, expected, atol=1e-4, rtol=0)


@pytest.mark.parametrize("key", CLASSIFIERS)
def test_ort_model_for_sequence_classification_gives_zoo_runs_labels(
        key: str, clients: dict, hf_client_exports: Lazy) -> None:
    expected = [row for rows in alone(load(hf_client_exports[key]).classify) for row in rows]
    got = clients[key, "sequence-classification", ""]
    assert got["labels"] == [next(iter(row)) for row in expected]
    for scores, row in zip(got["scores"], expected, strict=True):
        assert scores.keys() == row.keys()
        np.testing.assert_allclose([scores[label] for label in row], list(row.values()),
                                   atol=1e-4, rtol=0)


@pytest.mark.parametrize("key", TRANSLATORS)
def test_ort_model_for_seq2seq_lm_gives_zoo_runs_ids_greedy_tokens_and_text(
        key: str, clients: dict, hf_client_exports: Lazy) -> None:
    exported = load(hf_client_exports[key])
    got = clients[key, "translation", ""]
    eos = exported.card["eos_token_id"]
    assert len({tuple(tokens) for tokens in got["tokens"]}) > 1  # the sources matter
    for text, ids, tokens, translation in zip([*TRANSLATIONS, *TEXTS], got["inputs"],
                                              got["tokens"], got["texts"], strict=True):
        expected = exported.generate([text], GenerateOptions(max_new_tokens=STEPS))[0]
        assert ids == expected.prompt, text
        assert tokens == until_eos(expected.ids, eos), text
        assert translation == expected.text, text
