"""transformers.js in headless Chromium: examples/web/transformers.html loads fresh `zoo export`
folders by URL (fp32 and quantized, each under the file name its dtype opens), runs the task
their config.json names, and gives what `zoo run` gives on the same folder: the same greedy
tokens, sentence vectors and their cosines within 1e-4, the same labels, the same
translations (a quantized MarianMT import in the seq2seq layout). The ONNX Runtime Web
page (index.html) runs a quantized export too, finding its graph through the manifest. Both
pages generate `zoo run`'s tokens from an imported random Gemma 3 with a prompt past its window.

Needs what tests/clients/test_node_web.py's browser tests need, plus @huggingface/transformers in
examples/web/node_modules; skips without them, except under ZOO_REQUIRE_NODE_WEB=1."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from urllib.parse import urlencode

import numpy as np
import pytest

from export.opening import open_export
from tests.conftest import ON_HF_CLIENTS, Lazy
from tests.support.decoder_folders import GEMMA3
from tests.support.greedy import until_eos
from tests.support.hf_exports import TEXTS, TRANSLATIONS, alone
from tests.support.js import (
    PROMPTS,
    WEB_DIR,
    Page,
    browser_problem,
    open_pages,
    python_tokens,
    require,
    serving,
)
from zoo import GenerateOptions, load

pytestmark = ON_HF_CLIENTS  # the exports of tests/support/hf_exports.py, made once in that group
STEPS = 16
SERVED = ("gpt", "gpt-q4", "embedder-q8", "classifier", "translator-int8", GEMMA3)
GEMMA3_IDS = list(TEXTS[-1].encode("utf-8"))  # its byte-level tokenizer: 23 ids, window 4


@dataclass(frozen=True)
class TransformersPage:
    """transformers.html on an export `model` with `texts` (dtype: config.json's unless given)."""
    model: str
    texts: tuple[str, ...]
    dtype: str | None = None

    def args(self, server: str) -> list[str]:
        query = urlencode([("model", f"../{self.model}/"), *(("text", t) for t in self.texts),
                           ("steps", STEPS), *((("dtype", self.dtype),) if self.dtype else ()),
                           ("run", 1)])
        return [f"{server}web/transformers.html?{query}"]


PAGES = {
    "generate-fp32": TransformersPage("gpt", (TEXTS[0],)),
    "generate-q4": TransformersPage("gpt-q4", (TEXTS[1],)),
    "embed-q8": TransformersPage("embedder-q8", tuple(TEXTS)),
    "classify": TransformersPage("classifier", tuple(TEXTS)),
    "translate-int8": TransformersPage("translator-int8", tuple(TRANSLATIONS)),
    "wrong-dtype": TransformersPage("gpt-q4", (TEXTS[0],), "fp32"),
    "contract-page-q4": Page("gpt-q4", PROMPTS[0], STEPS),  # index.html, ONNX Runtime Web
    # an imported random Gemma 3: the prompt past its sliding window, the new tokens across it
    "generate-gemma3": TransformersPage(GEMMA3, (TEXTS[-1],)),
    "contract-page-gemma3": Page(GEMMA3, GEMMA3_IDS, STEPS),
}


@pytest.fixture(scope="module")
def server(hf_client_exports: Lazy, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    require(browser_problem())
    if not (WEB_DIR / "node_modules" / "@huggingface" / "transformers").is_dir():
        require("examples/web/node_modules/@huggingface/transformers missing: run "
                "`npm ci --ignore-scripts` there (make node-deps)")
    root = tmp_path_factory.mktemp("transformers-js-page")
    (root / "web").symlink_to(WEB_DIR)
    for key in SERVED:
        (root / key).symlink_to(hf_client_exports[key])
    with serving(root) as url:
        yield url


@pytest.fixture(scope="module")
def shown(server: str, tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict]:
    """What each of PAGES shows, by case, all from one Chromium launch."""
    pages = open_pages(server, tmp_path_factory.mktemp("pages"), list(PAGES.values()))
    return dict(zip(PAGES, pages, strict=True))


def assert_timed(page: dict) -> None:
    """The page's timings are real: loading and the whole run took time, and no more than the
    wall time check-page.mjs saw from load to done."""
    run = page["run"]
    assert 0 < run["loadMs"] < run["totalMs"] <= page["wallMs"], run
    assert f"loaded in {run['loadMs']:.1f} ms" in page["status"]


@pytest.mark.parametrize("case, key, dtype", [("generate-fp32", "gpt", "fp32"),
                                              ("generate-q4", "gpt-q4", "q4"),
                                              ("generate-gemma3", GEMMA3, "fp32")])
def test_generation_gives_zoo_runs_greedy_tokens(case: str, key: str, dtype: str,
                                                 shown: dict[str, dict],
                                                 hf_client_exports: Lazy) -> None:
    page, text = shown[case], PAGES[case].texts[0]
    assert page["state"] == "done", page["error"]
    exported = load(hf_client_exports[key])
    expected = until_eos(exported.generate([text], GenerateOptions(max_new_tokens=STEPS))[0].ids,
                         exported.card["eos_token_id"])
    prompt = exported.tokenizer.encode(text)
    assert page["tokens"] == prompt + expected
    assert page["run"]["dtype"] == dtype and f"dtype {dtype}" in page["status"]
    assert page["text"] == text + exported.tokenizer.decode(expected)  # as it was streamed
    assert_timed(page)
    assert 0 < page["run"]["firstMs"] and f"{page['tokensPerSecond']:.1f} tokens/s" in \
        page["status"]


def test_embedding_similarity_gives_zoo_runs_vectors_and_cosines(
        shown: dict[str, dict], hf_client_exports: Lazy) -> None:
    page = shown["embed-q8"]
    assert page["state"] == "done", page["error"]
    expected = np.vstack(alone(load(hf_client_exports["embedder-q8"]).embed))
    np.testing.assert_allclose(page["run"]["vectors"], expected, atol=1e-4, rtol=0)
    norms = np.linalg.norm(expected, axis=1)
    cosine = expected @ expected.T / np.outer(norms, norms)
    np.testing.assert_allclose(page["run"]["cosine"], cosine, atol=1e-4, rtol=0)
    assert page["run"]["dtype"] == "q8" and "mean pooling, normalized" in page["status"]
    assert_timed(page)


def test_classification_gives_zoo_runs_labels(shown: dict[str, dict],
                                              hf_client_exports: Lazy) -> None:
    page = shown["classify"]
    assert page["state"] == "done", page["error"]
    expected = [row for rows in alone(load(hf_client_exports["classifier"]).classify)
                for row in rows]
    assert page["run"]["labels"] == [next(iter(row)) for row in expected]
    for scores, row in zip(page["run"]["scores"], expected, strict=True):
        np.testing.assert_allclose([scores[label] for label in row], list(row.values()),
                                   atol=1e-4, rtol=0)
    assert_timed(page)


def test_translation_gives_zoo_runs_text(shown: dict[str, dict], hf_client_exports: Lazy
                                        ) -> None:
    """The seq2seq hook on a quantized MarianMT import: config.json's int8 opens the layout's
    encoder_model_int8.onnx and decoder_model_merged_int8.onnx."""
    page = shown["translate-int8"]
    assert page["state"] == "done", page["error"]
    exported = load(hf_client_exports["translator-int8"])
    expected = [exported.generate([text], GenerateOptions(max_new_tokens=STEPS))[0].text
                for text in TRANSLATIONS]
    assert page["run"]["translations"] == expected
    assert page["run"]["dtype"] == "int8"
    assert_timed(page)


def test_a_dtype_the_export_lacks_is_one_line_naming_the_file(shown: dict[str, dict]) -> None:
    page = shown["wrong-dtype"]
    assert page["state"] == "error" and page["run"] is None
    assert page["error"].startswith("error: ") and "/gpt-q4/onnx/model.onnx" in page["error"]


def test_the_contract_page_runs_a_quantized_export(shown: dict[str, dict],
                                                   hf_client_exports: Lazy) -> None:
    page = shown["contract-page-q4"]
    assert page["state"] == "done", page["error"]
    runtime = open_export(hf_client_exports["gpt-q4"])
    assert page["tokens"] == python_tokens(runtime, PROMPTS[0], STEPS)



def test_the_contract_page_generates_from_a_gemma_3_export(shown: dict[str, dict],
                                                          hf_client_exports: Lazy) -> None:
    """index.html (ONNX Runtime Web, onnx/model.onnx) on the imported Gemma 3: a prompt past
    the local layers' window, and Python ONNX Runtime's greedy tokens across it."""
    page = shown["contract-page-gemma3"]
    assert page["state"] == "done", page["error"]
    runtime = open_export(hf_client_exports[GEMMA3])
    assert len(GEMMA3_IDS) > runtime.card["sliding_window"]
    assert GEMMA3_IDS == load(hf_client_exports[GEMMA3]).tokenizer.encode(TEXTS[-1])
    assert page["tokens"] == python_tokens(runtime, GEMMA3_IDS, STEPS)
