"""transformers.js (@huggingface/transformers from npm, in Node.js) loads fresh `zoo export`
folders as they are and agrees with `zoo run` on them (the zoo's Python API: the same code):
the same greedy tokens (text-generation, from text through the export's own tokenizer files),
sentence vectors within 1e-4 (feature-extraction), the same labels and probabilities within
1e-4 (text-classification), a masked LM's five likeliest tokens and probabilities
(fill-mask, ModernBERT's), and for a translation model (a MarianMT import, and a T5 v1.1 one,
which the text2text-generation and summarization pipelines run the same way) the same source
ids from the export's tokenizer.json, the same greedy tokens (AutoModelForSeq2SeqLM over
onnx/encoder_model.onnx and onnx/decoder_model_merged.onnx) and the same text (`translation`).
Quantized exports too, opened by the `dtype` their files are named for (q4, int8, q8), or with
no dtype given by the one their config.json names. Imported random transformers Gemma 3 (every
prompt past its sliding window) and Qwen3-MoE models too (tests/support/decoder_folders.py).

Needs `node` and `npm ci --ignore-scripts` in examples/transformers-js (`make node-deps`);
skips where they are missing, except under ZOO_REQUIRE_NODE_WEB=1 (.ci/run), where that fails.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from export.opening import open_export
from runtime.contract import MODEL_GRAPH
from runtime.encode import encoder_feeds
from tests.conftest import ON_HF_CLIENTS, Lazy, SentencePieceGguf
from tests.support.decoder_folders import GEMMA3, QWEN3_MOE
from tests.support.greedy import until_eos
from tests.support.hf_exports import T5, TEXTS, TRANSLATIONS, TRANSLATOR, alone
from tests.support.js import SCRIPT, require, run_node, transformers_js_problem
from zoo import GenerateOptions, load

STEPS = 24
pytestmark = ON_HF_CLIENTS  # one worker makes the exports once


@pytest.fixture(scope="module")
def exports(hf_client_exports: Lazy) -> Lazy:
    require(transformers_js_problem())
    return hf_client_exports


def transformers_js(folder: Path, task: str, *args: str) -> dict:
    texts = [arg for text in TEXTS for arg in ("--text", text)] if "--text" not in args else []
    result = run_node(SCRIPT, str(folder), task, *texts, *args, timeout=120)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def dtype_args(dtype: str | None) -> list[str]:
    """run.mjs's --dtype (None: none given, so config.json's transformers.js_config decides)."""
    return ["--dtype", dtype] if dtype else []


@pytest.mark.parametrize("key, dtype", [("gpt", None), ("llama", None), ("gpt-q4", "q4"),
                                        ("gpt-int8", "int8"),
                                        # gemma-tiny's own export, only here: Gemma's local
                                        # layers run below in the Gemma 3 import's (slow)
                                        pytest.param("gemma", None, marks=pytest.mark.slow),
                                        # float16: its cache too; q4f16 by config.json's dtype
                                        ("gpt-fp16", "fp16"), ("gpt-q4f16", None),
                                        # weights in onnx/model.onnx_data, as past 2 GB
                                        ("gpt-external", None),
                                        # random transformers models imported: prompts past
                                        # Gemma 3's window (tests/clients/test_optimum.py checks
                                        # it), tokens that vary; Qwen3-MoE's experts
                                        (GEMMA3, None), (QWEN3_MOE, None)])
def test_text_generation_gives_zoo_runs_greedy_tokens(key: str, dtype: str | None,
                                                      exports: Lazy) -> None:
    exported = load(exports[key])
    for text in TEXTS:
        expected = until_eos(exported.generate([text], GenerateOptions(max_new_tokens=STEPS))[0]
                             .ids, exported.card["eos_token_id"])
        got = transformers_js(exports[key], "text-generation", "--text", text,
                              "--max-new-tokens", str(STEPS), *dtype_args(dtype))
        prompt = exported.tokenizer.encode(text)
        assert got["tokens"][:len(prompt)] == prompt, text  # the tokenizer files' own ids
        assert got["tokens"][len(prompt):] == expected, text


@pytest.mark.parametrize("key, dtype", [("embedder", None), ("embedder-q8", "q8"),
                                        ("embedder-q8", None), ("modernbert-embedder", None)])
def test_feature_extraction_gives_the_sentence_embedding(key: str, dtype: str | None,
                                                         exports: Lazy) -> None:
    expected = np.vstack(alone(load(exports[key]).embed))
    got = np.array(transformers_js(exports[key], "feature-extraction", "--pooling",
                                   "mean", "--normalize", *sum((["--text", t] for t in TEXTS),
                                                               []), *dtype_args(dtype))["vectors"])
    assert got.shape == expected.shape
    np.testing.assert_allclose(got, expected, atol=1e-4, rtol=0)


@pytest.mark.parametrize("key, dtype", [("classifier", None), ("pooler-classifier", None),
                                        ("classifier-q8", "q8"), ("modernbert-classifier", None),
                                        ("modernbert-classifier-q8", "q8")])
def test_text_classification_gives_zoo_runs_labels(key: str, dtype: str | None,
                                                   exports: Lazy) -> None:
    expected = [row for rows in alone(load(exports[key]).classify) for row in rows]
    got = transformers_js(exports[key], "text-classification", *dtype_args(dtype))
    assert got["labels"] == [next(iter(row)) for row in expected]
    for scores, row in zip(got["scores"], expected, strict=True):
        assert scores.keys() == row.keys()
        np.testing.assert_allclose([scores[label] for label in row], list(row.values()),
                                   atol=1e-4, rtol=0)


def test_fill_mask_gives_the_mlm_heads_likeliest_tokens(exports: Lazy) -> None:
    """ModernBERT's masked LM (ModernBertForMaskedLM in config.json): the fill-mask pipeline's
    five tokens and probabilities at the mask are the export's own logits' softmax."""
    key = "modernbert-embedder"  # an embedder that kept its MLM head
    runtime = open_export(exports[key])
    tokenizer = load(exports[key]).tokenizer
    mask = runtime.card["mask_token_id"]
    got = transformers_js(exports[key], "fill-mask", "--text", "ROMEO: <|mask|> art thou")
    ids = tokenizer.encode("ROMEO: ") + [mask] + tokenizer.encode(" art thou")
    logits = runtime.run(MODEL_GRAPH, encoder_feeds(runtime.card, np.array([ids])))["logits"]
    at = logits[0, ids.index(mask)].astype(np.float64)
    probabilities = np.exp(at - at.max()) / np.exp(at - at.max()).sum()
    best = list(np.argsort(-probabilities)[:5])
    assert got["tokens"][0] == best
    np.testing.assert_allclose(got["scores"][0], probabilities[best], atol=1e-4, rtol=0)


@pytest.mark.parametrize("key, dtype", [(TRANSLATOR, None), ("translator-int8", None),
                                        ("translator-int8", "int8"), (T5, None),
                                        ("t5-int8", "int8"), ("translator-fp16", "fp16")])
def test_translation_gives_zoo_runs_ids_greedy_tokens_and_text(key: str, dtype: str | None,
                                                               exports: Lazy) -> None:
    exported = load(exports[key])
    texts = [*TRANSLATIONS, *TEXTS]  # the shipped text's words, then some it never saw
    got = transformers_js(exports[key], "translation", *sum((["--text", t] for t in texts), []),
                          "--max-new-tokens", str(STEPS), *dtype_args(dtype))
    eos = exported.card["eos_token_id"]
    assert len({tuple(tokens) for tokens in got["tokens"]}) > 1  # the sources matter
    for text, ids, tokens, translation in zip(texts, got["inputs"], got["tokens"], got["texts"],
                                              strict=True):
        expected = exported.generate([text], GenerateOptions(max_new_tokens=STEPS))[0]
        assert ids == expected.prompt, text  # tokenizer.json: the sentencepiece files' ids
        assert tokens == until_eos(expected.ids, eos), text
        assert translation == expected.text, text


@pytest.mark.parametrize("key, task, dtype, file", [
    ("gpt-q4", "text-generation", "fp32", "onnx/model.onnx"),
    ("gpt-q4", "text-generation", "q8", "onnx/model_quantized.onnx"),
    ("embedder-q8", "feature-extraction", "fp32", "onnx/model.onnx"),
    ("translator-int8", "translation", "fp32", "onnx/encoder_model.onnx"),
])
def test_a_dtype_the_export_was_not_made_in_is_a_missing_file(key: str, task: str, dtype: str,
                                                              file: str, exports: Lazy) -> None:
    """A quantized export holds only its dtype's graph: transformers.js asked for another
    looks for that dtype's file and finds none (no quantized weights under an fp32 name)."""
    result = run_node(SCRIPT, str(exports[key]), task, "--text", "a", "--dtype", dtype,
                      timeout=120)
    assert result.returncode == 1
    assert f'not found locally at "{exports[key] / file}"' in result.stderr, result.stderr


def test_a_gguf_sentencepiece_tokenizer_gives_bos_the_pieces_and_zoo_runs_tokens(
        sentencepiece_gguf: SentencePieceGguf) -> None:
    """A Llama 2 style GGUF import (zoo/files/gguf_tokenizer.py's tokenizer.json): transformers.js
    encodes each text as SentencePiece does, BOS first (a text that starts with a space too),
    and continues it with zoo run's greedy tokens."""
    require(transformers_js_problem())
    from tests.support.gguf_files import SPM_TEXTS

    pieces, folder = sentencepiece_gguf.pieces, sentencepiece_gguf.exported
    exported = load(folder)
    for text in SPM_TEXTS:
        prompt = [pieces.bos_id(), *pieces.encode(text)]
        expected = until_eos(exported.generate([text], GenerateOptions(max_new_tokens=8))[0].ids,
                             exported.card["eos_token_id"])
        got = transformers_js(folder, "text-generation", "--text", text, "--max-new-tokens", "8")
        assert got["tokens"] == prompt + expected, text
