"""The browser page runs an encoder-decoder export under the cross-cache contract (issue #12):
headless Chromium's greedy tokens equal Python's (ONNX Runtime and PyTorch). Needs what
tests/clients/test_node_web.py needs, and skips (or fails under ZOO_REQUIRE_NODE_WEB=1) the same
way."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import SharedExport, on_shared
from tests.support.js import (
    PROMPTS,
    WEB_DIR,
    Page,
    browser_problem,
    engines,
    open_pages,
    python_tokens,
    require,
    serving,
)

NAME = "transformer-tiny"
# Reads the session's shared transformer-tiny export, in the worker group that holds it.
pytestmark = on_shared(NAME)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, shared_export: SharedExport
           ) -> Iterator[tuple[str, Path]]:
    require(browser_problem())
    root = tmp_path_factory.mktemp("web-seq2seq")
    (root / "t2t").symlink_to(shared_export(NAME)[0])
    (root / "web").symlink_to(WEB_DIR)
    with serving(root) as url:
        yield url, root / "t2t"


def test_page_translates_with_the_tokens_python_gives(server: tuple[str, Path],
                                                      tmp_path: Path) -> None:
    url, folder = server
    runtime, torch_engine = engines(folder)
    prompts = PROMPTS[:2]
    pages = open_pages(url, tmp_path, [Page("t2t", ids, 20) for ids in prompts])
    for ids, shown in zip(prompts, pages, strict=True):
        assert shown["state"] == "done", shown["error"]
        expected = python_tokens(runtime, ids, 20)
        assert python_tokens(torch_engine, ids, 20) == expected
        assert shown["tokens"] == expected and len(expected) > 1
        assert "source of" in shown["status"]
