"""Hostile chat templates and export files (issue 37, items 2, 3 and 7): `zoo run OUT --chat` on
a gpt-tiny export given a tokenizer.json and a chat_template.jinja. A template that loops
without end, writes without end, or raises a Python error inside the sandbox is refused in one
line naming the template, within a bounded time; a file an export reads that is a symlink out
of the folder (listed in manifest.json or not) is refused in one line naming it, before it is
read: the outside text is never printed."""

from __future__ import annotations

import json
import resource
import shutil
import sys
import time
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper
from tokenizers import Tokenizer, models, pre_tokenizers

from runtime.contract import MANIFEST
from runtime.files.atomic import sha256
from runtime.files.chat import CHAT_TEMPLATE, RENDER_CHARS, RENDER_SECONDS
from tests.conftest import on_shared
from tests.support.helpers import assert_one_line_error, zoo, zoo_ok

pytestmark = on_shared("gpt-tiny")

SECRET = "TOP-SECRET-7731"
WORDS = ["[UNK]", "<|user|>", "<|assistant|>", "hi", "there"]
GOOD = ("{% for m in messages %}<|{{ m['role'] }}|> {{ m['content'] }} {% endfor %}"
        "{% if add_generation_prompt %}<|assistant|>{% endif %}")


@pytest.fixture
def chat_export(tmp_path: Path, shared_export) -> Path:
    """A copy of the shared gpt-tiny export with a word-level tokenizer.json (ids below its
    vocab_size) and a good chat template, neither listed in manifest.json."""
    folder = tmp_path / "exp"
    shutil.copytree(shared_export("gpt-tiny")[0], folder)
    tokenizer = Tokenizer(models.WordLevel({w: i for i, w in enumerate(WORDS)}, unk_token="[UNK]"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer.save(str(folder / "tokenizer.json"))
    (folder / CHAT_TEMPLATE).write_text(GOOD, encoding="utf-8")
    return folder


def chat(folder: Path, template: str | None = None):
    if template is not None:
        (folder / CHAT_TEMPLATE).write_text(template, encoding="utf-8")
    return zoo("run", folder, "--chat", "hi", "--max-new-tokens", "2")


def test_a_good_template_still_runs(chat_export: Path) -> None:
    """The bounds refuse nothing a real template does (loops over messages, `loop`)."""
    zoo_ok("run", chat_export, "--chat", "hi", "--max-new-tokens", "2")


# --- item 2: bounded by time and by size ----------------------------------------------------

NESTED = "{% for i in range(100000) %}{% for j in range(100000) %}BODY{% endfor %}{% endfor %}"


def test_nested_loops_that_write_nothing_stop_on_time(chat_export: Path) -> None:
    """The issue's 10^5 x 10^5 loops, writing nothing: only the time bound can stop them (each
    `range` is within the sandbox's own bound). Its clock is read at every loop step and at
    the inner `range(...)` call of each outer step (either alone stops this one; without both
    it ran past 100 s). Stopped within twice the budget, the export's opening included."""
    start = time.monotonic()
    result = chat(chat_export, NESTED.replace("BODY", ""))
    assert time.monotonic() - start < 2 * RENDER_SECONDS
    assert_one_line_error(result, CHAT_TEMPLATE, "refused the chat template",
                          f"ran past the {RENDER_SECONDS:g} s")


@pytest.mark.parametrize("template", [
    "{% macro f(n) %}{% if n %}{{ f(n - 1) }}{{ f(n - 1) }}{% endif %}{% endmacro %}{{ f(60) }}",
    "{% set s = 'abcdefghij' * 1000 %}{% for a in s %}{% for b in s %}{% endfor %}{% endfor %}",
    "{% set x %}" + NESTED.replace("BODY", "x") + "{% endset %}{{ x }}",
], ids=["macro-tree", "loops-over-a-string", "buffered-in-a-set-block"])
def test_work_without_a_range_or_written_text_stops_on_time(chat_export: Path,
                                                            template: str) -> None:
    """The same class: a macro calling itself twice per level (no loop at all), loops over a
    string, and text kept in a variable (not written until the end)."""
    start = time.monotonic()
    result = chat(chat_export, template)
    assert time.monotonic() - start < 2 * RENDER_SECONDS
    assert_one_line_error(result, CHAT_TEMPLATE, f"ran past the {RENDER_SECONDS:g} s")


@pytest.mark.parametrize("template, says", [
    (NESTED.replace("BODY", "{{ j }}"), f"wrote past the {RENDER_CHARS} characters"),
    ("{{ 'x' * 100000 * 100000 }}", f"made a value of more than the {RENDER_CHARS} items"),
    ("{{ [0] * 10 ** 5000 }}", f"made a value of more than the {RENDER_CHARS} items"),
    ("{{ 10 ** 100000000 }}", f"made a number of more than the {RENDER_CHARS} bits"),
    ("{{ 'x'|center(1000000000) }}", f"passed a number past the {RENDER_CHARS}"),
    ("{{ 'x'.ljust(1000000000) }}", f"passed a number past the {RENDER_CHARS}"),
    ("{{ messages|slice(1000000000)|list|length }}", f"passed a number past the {RENDER_CHARS}"),
])
def test_huge_output_or_values_are_refused_before_they_are_made(chat_export: Path,
                                                                template: str, says: str) -> None:
    """Text past the size bound is refused as it comes, well before the time bound; a value
    past it (`*`, `**`, a count given to a call or filter) before it is made."""
    start = time.monotonic()
    result = chat(chat_export, template)
    assert time.monotonic() - start < RENDER_SECONDS
    assert_one_line_error(result, CHAT_TEMPLATE, "refused the chat template", says)


def test_a_template_file_larger_than_any_prompt_is_refused_unread(chat_export: Path) -> None:
    start = time.monotonic()
    result = chat(chat_export, "{{ 'x' }}" * (RENDER_CHARS // 9 + 1))
    assert time.monotonic() - start < RENDER_SECONDS
    assert_one_line_error(result, CHAT_TEMPLATE, f"past the {RENDER_CHARS} the zoo reads")


# --- issue 43: bounded by memory as well -----------------------------------------------------

@pytest.mark.skipif(not sys.platform.startswith("linux"),
                    reason="only Linux's kernel enforces a worker's RLIMIT_AS")
@pytest.mark.parametrize("template", [
    "{{ '%1000000000d' % 1 }}",
    "{% set s = 'a' * 100000 %}{{ s.replace('a', s) }}",
    "{{ '{:1000000000}'.format(1) }}",
], ids=["printf-width", "replace", "format-width"])
def test_one_operation_that_makes_gigabytes_is_refused(tmp_path: Path, template: str) -> None:
    """Each makes a gigabyte or more in one C call, between two of the sandbox's checks: the
    render's worker process meets its address-space limit (RENDER_MEMORY) and refuses; this
    process's peak memory does not move by it, and the next render is served."""
    from registry.errors import ZooError
    from runtime.files.chat_worker import render_chat

    path = tmp_path / CHAT_TEMPLATE
    messages = [{"role": "user", "content": "hi"}]
    path.write_text(GOOD, encoding="utf-8")
    assert render_chat(path, messages) == "<|user|> hi <|assistant|>"  # the worker started
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    path.write_text(template, encoding="utf-8")
    with pytest.raises(ZooError, match="refused the chat template: it needed more memory"):
        render_chat(path, messages)
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 - peak < 100 << 20
    path.write_text(GOOD, encoding="utf-8")
    assert render_chat(path, messages) == "<|user|> hi <|assistant|>"


def test_a_render_past_its_deadline_loses_its_worker(tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """A render stuck inside one C call never reaches the budget's clock: its worker is killed
    at the deadline (made to have passed here), and the next render starts another."""
    import runtime.files.chat_worker as chat_worker
    from registry.errors import ZooError

    path = tmp_path / CHAT_TEMPLATE
    path.write_text(GOOD, encoding="utf-8")
    messages = [{"role": "user", "content": "hi"}]
    with monkeypatch.context() as patch:
        patch.setattr(chat_worker, "GRACE", -10 * RENDER_SECONDS)
        with pytest.raises(ZooError, match=f"ran past the {RENDER_SECONDS:g} s"):
            chat_worker.render_chat(path, messages)
    assert chat_worker.render_chat(path, messages) == "<|user|> hi <|assistant|>"


# --- item 7: Python's errors inside the sandbox ---------------------------------------------

@pytest.mark.parametrize("template, says", [
    ("{{ range(10**6) }}", "OverflowError: Range too big"),
    ("{{ bos_token + 1 }}", "TypeError: can only concatenate str"),
    ("{{ 1 / 0 }}", "ZeroDivisionError"),
    ("{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}", "RecursionError"),
    ("{{ messages[5]['content'] }}", "has no element 5"),
    ("{{ raise_exception('no system role\nafter a newline') }}", "no system role"),
    ("{{ ''.__class__.__mro__ }}", "access to attribute '__class__'"),
    ("{% for %}", "Expected an expression"),
])
def test_errors_inside_the_template_are_one_line(chat_export: Path, template: str,
                                                 says: str) -> None:
    assert_one_line_error(chat(chat_export, template), CHAT_TEMPLATE,
                          "the chat template failed", says)


# --- item 3: every file the export reads stays in its folder --------------------------------

def test_a_chat_template_symlinked_out_is_refused_unread(chat_export: Path) -> None:
    (chat_export.parent / "secret.txt").write_text(f"{SECRET} {{{{ 1 }}}} {{% if %}}")
    (chat_export / CHAT_TEMPLATE).unlink()
    (chat_export / CHAT_TEMPLATE).symlink_to("../secret.txt")
    result = chat(chat_export)
    assert SECRET not in result.output
    assert_one_line_error(result, f"'{CHAT_TEMPLATE}' is a symlink out of the folder")


def test_a_tokenizer_symlinked_out_is_refused_unread(chat_export: Path) -> None:
    """tokenizer.json, not in the manifest, read for --text and --chat alike."""
    shutil.move(chat_export / "tokenizer.json", chat_export.parent / "elsewhere.json")
    (chat_export / "tokenizer.json").symlink_to(chat_export.parent / "elsewhere.json")
    for args in (["--chat", "hi"], ["--text", "hi"]):
        assert_one_line_error(zoo("run", chat_export, *args), "tokenizer file 'tokenizer.json'",
                              "is a symlink out of the folder")


def test_a_manifest_symlinked_out_is_refused_unread(chat_export: Path) -> None:
    """The manifest itself: one outside, which names files and values, is never read."""
    manifest = json.loads((chat_export / MANIFEST).read_text())
    manifest["format_version"] = SECRET
    (chat_export.parent / "other.json").write_text(json.dumps(manifest))
    (chat_export / MANIFEST).unlink()
    (chat_export / MANIFEST).symlink_to(chat_export.parent / "other.json")
    result = zoo("run", chat_export, "--ids", "1")
    assert SECRET not in result.output
    assert_one_line_error(result, f"manifest '{MANIFEST}'", "is a symlink out of the folder")


def test_external_data_symlinked_out_is_refused_by_onnx_runtime(tmp_path: Path,
                                                                chat_export: Path) -> None:
    """A graph's external data is read by ONNX Runtime itself, which refuses a location that
    resolves out of the graph's folder (1.31 does): one line naming the graph."""
    (tmp_path / "secret.bin").write_bytes(np.arange(4, dtype=np.float32).tobytes())
    weight = helper.make_tensor("w", TensorProto.FLOAT, [4], np.ones(4, np.float32).tobytes(),
                                raw=True)
    weight.ClearField("raw_data")
    weight.data_location = TensorProto.EXTERNAL
    for key, value in (("location", "data.bin"), ("offset", "0"), ("length", "16")):
        entry = weight.external_data.add()
        entry.key, entry.value = key, value
    graph = helper.make_graph([helper.make_node("Identity", ["w"], ["y"])], "g", [],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4])],
                              [weight])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=9)
    onnx.save(model, str(chat_export / "onnx/model.onnx"))
    (chat_export / "onnx/data.bin").symlink_to(tmp_path / "secret.bin")
    manifest = json.loads((chat_export / MANIFEST).read_text())
    manifest["files"]["onnx/model.onnx"]["sha256"] = sha256(chat_export / "onnx/model.onnx")
    (chat_export / MANIFEST).write_text(json.dumps(manifest))
    assert_one_line_error(zoo("run", chat_export, "--ids", "1"), "onnx/model.onnx",
                          "External data path escapes model directory")
