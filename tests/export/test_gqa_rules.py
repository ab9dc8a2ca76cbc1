"""Issue 49, finding 1: ONNX Runtime's GroupQueryAttention rules as data
(export/onnx/gqa_rules.py), each run against ONNX Runtime here: a grid of head sizes (4 to 256),
rotary in and out of the kernel, first prompts, later prompts and decoding steps; every decoder
card's own shape with the rotary placement its plan chooses; and an `--optimize` export whose
head size the kernel's rotary refuses (24, and 8 as a tiny Mixtral's) rotating before the
kernel, passing the export's own checks, with the manifest saying why."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from export.families.decoder import DecoderFamily
from export.onnx.gqa_rules import attention_plan
from registry.sizes import attention_sizes
from tests.conftest import ALL_CARDS, card
from tests.support.gqa import gqa_accepts

ROTARY_CASES = (False, True)
# (new tokens, past tokens): a first prompt, a later prompt (batch 1), a decoding step
LENGTHS = ((1, 0), (5, 0), (4, 6), (1, 9))


@pytest.mark.parametrize("rotary", ROTARY_CASES, ids=["rotary-before", "rotary-in-kernel"])
def test_each_rule_is_what_onnx_runtime_does(rotary: bool) -> None:
    """Head sizes 4..256 (every multiple of 4), at each length: ONNX Runtime accepts a shape
    exactly where the rules say it does. A rule admitting head size 8 with rotary in the
    kernel fails here (planted in tests/support/mutants.py)."""
    wrong = []
    for head_size in range(4, 257, 4):
        plan = attention_plan(head_size, rotary)
        expected = plan.rotary_in_kernel if rotary else plan.runs
        for new, past in LENGTHS:
            if gqa_accepts(head_size, rotary, new, past) != expected:
                wrong.append((head_size, new, past, expected))
    assert wrong == []


DECODERS = [name for name in ALL_CARDS if card(name).family == "decoder"]


@pytest.mark.parametrize("name", DECODERS)
def test_every_decoder_cards_shape_runs_as_its_plan_says(name: str) -> None:
    """Each shipped and tiny decoder card's own head size, heads and key/value heads, its
    rotary where its plan puts it: ONNX Runtime runs it (every card's head size is one the
    kernel takes; one that is not makes no shared-cache graph:
    tests/hostile/test_hostile_clients.py)."""
    spec = card(name)
    sizes = attention_sizes(spec)
    plan = DecoderFamily.attention_plan(spec)
    assert plan.runs, plan.why
    assert gqa_accepts(sizes.head_dim, plan.rotary_in_kernel, 3, 0,
                       heads=spec["n_heads"], kv_heads=spec["n_kv_heads"] or spec["n_heads"])


@pytest.mark.parametrize(("fields", "head_size"), [
    pytest.param({"d_model": 48, "n_heads": 2, "n_kv_heads": 1, "d_ff": 96}, 24,
                 marks=pytest.mark.slow),  # the same path as head 8: make test-slow
    ({"d_model": 32, "n_heads": 4, "n_kv_heads": 2, "d_ff": 64}, 8),
], ids=["head-24", "head-8"])
def test_an_optimize_export_rotates_before_the_kernel_where_it_must(
        tmp_path: Path, fields: dict, head_size: int) -> None:
    """Once a traceback from inside ONNX Runtime ("head_size shall be a multiple of 16") after
    the whole export: now the export passes its checks (the shared-cache loop against the plain
    graph on a left-padded batch), the kernel runs without do_rotary, and the manifest says why."""
    import onnx

    from export.options import ExportOptions
    from export.pipeline import export_and_verify
    from zoo.assemble import build_model

    spec = card("llama-tiny", **fields)
    assert attention_sizes(spec).head_dim == head_size
    model = build_model(spec, seed=1).eval()
    out = tmp_path / "out"
    assert export_and_verify(model, spec, out, ExportOptions(optimize=True)).passed
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["attention"]["onnx/model_kv.onnx"].startswith(
        f"GroupQueryAttention, rotary before the kernel: head size {head_size} is not a "
        "multiple of 16")
    graph = onnx.load(out / "onnx" / "model_kv.onnx", load_external_data=False).graph
    kernels = [n for n in graph.node if n.op_type == "GroupQueryAttention"]
    assert kernels and all(a.name != "do_rotary" or a.i == 0
                           for n in kernels for a in n.attribute)
