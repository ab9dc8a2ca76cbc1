"""Attention maps (issue #10): the probabilities PyTorch records, the `--attentions` outputs of
every family's ONNX graphs, and `zoo attention`'s pictures and errors.

References are the maps' defining properties (rows sum to 1; causal maps are zero above the
diagonal; padded keys get no weight) and, across engines, PyTorch against ONNX Runtime.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch
from click.testing import CliRunner
from matplotlib.image import imread

from cli import main
from export.families import family_of
from export.inspect.attention import Request, draw_attention
from export.opening import open_export
from tests.conftest import (
    TINY_CARDS,
    Lazy,
    SharedExport,
    card,
    on_shared,
    prompt_feeds,
    random_ids,
)
from zoo.assemble import build_model
from zoo.blocks.attention import recorded_attentions

# The tests that read the session's shared exports run in their card's pytest-xdist group, so
# each export is made once (tests/conftest.py: shared_export, on_shared).
pytestmark = on_shared("gpt-tiny")

GROUPS = {"gpt-tiny": ("attentions",), "llama-tiny": ("attentions",), "bert-tiny": ("attentions",),
          "modernbert-tiny": ("attentions",),
          "moe-tiny": ("attentions",),
          "gemma-tiny": ("attentions",),
          "transformer-tiny": ("encoder_attentions", "decoder_attentions", "cross_attentions"),
          "t5-tiny": ("encoder_attentions", "decoder_attentions", "cross_attentions")}


def run_recorded(name: str, ids: torch.Tensor, mask: torch.Tensor) -> dict[str, list]:
    model = build_model(card(name), seed=0)
    with torch.no_grad(), recorded_attentions(model.attention_groups()) as maps:
        if card(name).family == "encoder-decoder":
            model(ids, ids[:, :5], mask)
        else:
            model(ids, mask)
    return {group: [calls[0] for calls in layers] for group, layers in maps.items()}


@pytest.mark.parametrize("name", TINY_CARDS)
def test_recorded_maps_are_probabilities_that_respect_masks(name: str) -> None:
    ids = random_ids(card(name), 2, 9)
    mask = torch.ones(2, 9, dtype=torch.long)
    mask[1, 6:] = 0  # row 1: its last three keys are padding
    maps = run_recorded(name, ids, mask)
    assert set(maps) == set(GROUPS[name])
    heads = card(name)["n_heads"]
    for group, layers in maps.items():
        assert len(layers) == card(name)["n_layers"]
        for weights in layers:
            assert weights.shape[:2] == (2, heads)
            torch.testing.assert_close(weights.sum(-1), torch.ones(weights.shape[:-1]))
            if group in ("attentions", "encoder_attentions", "cross_attentions"):
                real_queries = slice(None) if group == "cross_attentions" else slice(0, 6)
                padded = weights[1, :, real_queries, 6:]
                assert padded.abs().max() < 1e-6, f"{group}: padded keys got weight"
            if group in ("decoder_attentions",) or card(name).family == "decoder":
                above = torch.triu(torch.ones(weights.shape[-2:], dtype=torch.bool), 1)
                assert weights[..., above].abs().max() == 0, f"{group}: sees the future"


@pytest.fixture(scope="module")
def attention_exports(shared_export: SharedExport) -> Lazy:
    def made(name: str) -> Path:
        folder, report = shared_export(name, "attentions")
        labels = {row.output for row in report.rows}
        for group in GROUPS[name]:  # the grid compared every group (with and without a past)
            assert any(label.endswith(f"{group}.*") for label in labels), labels
        return folder

    return Lazy(TINY_CARDS, made)


# One card of each family exports its attentions in the default run (the decoder, the encoder,
# the encoder-decoder's three groups); the other cards' exports (tens of seconds each) add the
# same outputs over their own blocks, whose maps test_recorded_maps_... checks on every card
# in PyTorch: make test-slow.
EXPORTED_BY_DEFAULT = ("gpt-tiny", "bert-tiny", "transformer-tiny")
EXPORTED_CARDS = [name if name in EXPORTED_BY_DEFAULT else
                  pytest.param(name, marks=pytest.mark.slow) for name in TINY_CARDS]


@pytest.mark.parametrize("name", EXPORTED_CARDS)
def test_attention_outputs_are_in_the_contract_and_the_manifest(name: str,
                                                               attention_exports: dict) -> None:
    tiny = card(name)
    manifest = open_export(attention_exports[name]).manifest
    n = tiny["n_layers"]
    declared = [output for file in manifest["attentions"]["outputs"].values()
                for output in file]
    assert declared == [f"{group}.{i}" for group in GROUPS[name] for i in range(n)]
    plain = family_of(tiny).contract(tiny)
    for file, graph in manifest["graphs"].items():
        extra = graph["outputs"][len(plain[file][1]):]
        assert graph["outputs"][:len(plain[file][1])] == plain[file][1]  # appended at the end
        assert extra == manifest["attentions"]["outputs"][file]


@pytest.mark.parametrize("name", EXPORTED_CARDS)
def test_zoo_attention_draws_what_onnx_runtime_computes(name: str, attention_exports: dict,
                                                        tmp_path: Path) -> None:
    tiny = card(name)
    ids = [5, 9, 17, 33, 41, 12]
    png, numbers = tmp_path / "map.png", tmp_path / "map.json"
    result = CliRunner().invoke(main, ["attention", str(attention_exports[name]), "--ids",
                                       ",".join(map(str, ids)), "-o", str(png), "--json",
                                       str(numbers), "--generate", "0"])
    assert result.exit_code == 0, result.output
    layers, heads = tiny["n_layers"], tiny["n_heads"]
    image = imread(png)
    columns = math.ceil(math.sqrt(layers * heads))  # an about-square grid, layer by layer
    rows = math.ceil(layers * heads / columns)
    assert image.shape[:2] == (round(3.5 * 100 * rows), round(4.0 * 100 * columns))
    drawn = json.loads(numbers.read_text())
    assert len(drawn["panels"]) == layers * heads
    # The numbers drawn against ONNX Runtime run here directly on the same graph.
    runtime = open_export(attention_exports[name])
    source = np.array([ids], np.int64)
    ones = np.ones_like(source)
    shape = (1, heads, 0, tiny["d_model"] // heads)
    if tiny.family == "encoder-decoder":  # the start token's cross-attention onto the source
        memory = runtime.run("encoder.onnx", {"input_ids": source, "attention_mask": ones})
        feeds = {"input_ids": np.array([[tiny["bos_token_id"]]]), "attention_mask": ones,
                 "encoder_attention_mask": ones}
        del feeds["attention_mask"]
        feeds |= {f"past_key_values.{i}.decoder.{kv}": np.zeros(shape, np.float32)
                  for i in range(layers) for kv in ("key", "value")}
        feeds |= {f"past_key_values.{i}.encoder.{kv}": memory[f"present.{i}.encoder.{kv}"]
                  for i in range(layers) for kv in ("key", "value")}
        outputs, group = runtime.run("decoder.onnx", feeds), "cross_attentions"
        assert drawn["query_ids"] == [tiny["bos_token_id"]] and drawn["key_ids"] == ids
    else:
        feeds = {"input_ids": source, "attention_mask": ones}
        if tiny.family == "decoder":
            feeds = prompt_feeds(tiny, ids)
        elif tiny["type_vocab_size"]:
            feeds["token_type_ids"] = np.zeros_like(source)
        outputs, group = runtime.run("onnx/model.onnx", feeds), "attentions"
    assert drawn["attention"] == group
    for panel in drawn["panels"]:
        expected = outputs[f"{group}.{panel['layer']}"][0, panel["head"]]
        np.testing.assert_allclose(panel["weights"], expected, atol=1e-6)


def test_the_pictures_hold_the_maps_in_grid_order(attention_exports: dict,
                                                   tmp_path: Path) -> None:
    """What matplotlib holds, panel by panel (layers x heads, row by row), is the map of that
    layer and head as ONNX Runtime computes it."""
    folder = attention_exports["gpt-tiny"]
    request = Request(str(folder), ids=[5, 9, 17, 33], generate=2)
    looked, drawn = draw_attention(request, tmp_path / "map.png")
    tiny = card("gpt-tiny")
    assert drawn.panels == tiny["n_layers"] * tiny["n_heads"] == len(drawn.images)
    ids = looked.group.queries
    assert ids[:4] == [5, 9, 17, 33] and len(ids) == 6  # the prompt and 2 generated tokens
    heads = tiny["n_heads"]
    outputs = open_export(folder).run("onnx/model.onnx", prompt_feeds(tiny, ids))
    for index, image in enumerate(drawn.images):
        layer, head = divmod(index, heads)
        np.testing.assert_allclose(image, outputs[f"attentions.{layer}"][0, head], atol=1e-6)


@on_shared("transformer-tiny")
def test_torch_and_onnx_engines_draw_the_same_cross_attention(attention_exports: dict,
                                                              tmp_path: Path) -> None:
    folder = attention_exports["transformer-tiny"]
    drawn = {}
    for engine in ("torch", "onnx"):
        out = tmp_path / f"{engine}.json"
        result = CliRunner().invoke(main, ["attention", str(folder), "--ids", "5,6,7,8",
                                           "--engine", engine, "--generate", "4", "--layer",
                                           "1", "-o", str(tmp_path / f"{engine}.png"),
                                           "--json", str(out)])
        assert result.exit_code == 0, result.output
        drawn[engine] = json.loads(out.read_text())
    assert drawn["torch"]["query_ids"] == drawn["onnx"]["query_ids"]
    assert len(drawn["onnx"]["query_ids"]) == 5  # start token + 4 generated
    for a, b in zip(drawn["torch"]["panels"], drawn["onnx"]["panels"], strict=True):
        np.testing.assert_allclose(a["weights"], b["weights"], atol=1e-5)


@pytest.mark.parametrize("args, message", [
    (["--layer", "7"], "--layer 7: the model has layers 0..1"),
    (["--head", "-1"], "--head -1: the model has heads 0..3"),
    (["--ids", "99999"], "--ids: token id 99999 is not in the vocabulary"),
    (["--kind", "cross"], "--kind cross: this model has attentions"),
    (["--image", "cat.png"], "--image: gpt-tiny reads tokens, not images"),
])
def test_bad_requests_are_one_line_and_write_nothing(args: list[str], message: str,
                                                     attention_exports: dict,
                                                     tmp_path: Path) -> None:
    png = tmp_path / "map.png"
    base = ["attention", str(attention_exports["gpt-tiny"]), "-o", str(png)]
    if "--ids" not in args:
        base += ["--ids", "5,6,7"]
    result = CliRunner().invoke(main, base + args)
    assert result.exit_code == 2, result.output
    assert result.output.strip().splitlines() == [f"error: {message}"] or \
        result.output.startswith(f"error: {message}"), result.output
    assert len(result.output.strip().splitlines()) == 1
    assert not png.exists()


@on_shared("bert-tiny")
def test_an_export_without_attentions_and_an_unwritable_path_are_refused(
        tmp_path: Path, shared_export: SharedExport) -> None:
    plain, _ = shared_export("bert-tiny")
    result = CliRunner().invoke(main, ["attention", str(plain), "--ids", "5,6",
                                       "-o", str(tmp_path / "a.png")])
    assert result.exit_code == 2
    assert "export it again with --attentions" in result.output
    assert len(result.output.strip().splitlines()) == 1
    blocked = tmp_path / "file"
    blocked.write_text("not a folder")
    result = CliRunner().invoke(main, ["attention", "bert-tiny", "--ids", "5,6", "-o",
                                       str(blocked / "a.png")])
    assert result.exit_code == 2 and len(result.output.strip().splitlines()) == 1, \
        result.output
    assert not (tmp_path / "a.png").exists()


def coloured_runs(mask: np.ndarray, least: int) -> list[tuple[int, int]]:
    """(start, end) of the runs of True in `mask` at least `least` long."""
    edges = np.diff(np.concatenate([[0], mask.astype(int), [0]]))
    return [(start, end) for start, end in zip(np.flatnonzero(edges == 1),
                                               np.flatnonzero(edges == -1), strict=True)
            if end - start >= least]


@pytest.mark.parametrize("heads, grid", [(9, (3, 3)), (12, (4, 3))])
def test_a_layers_heads_are_drawn_as_an_about_square_grid(heads: int, grid: tuple[int, int],
                                                          tmp_path: Path) -> None:
    """Read from the PNG itself (Pillow): one heatmap per head, `grid` = (columns, rows) of
    them, and the picture's proportions those of the grid, not one long row."""
    from PIL import Image

    cards = tmp_path / "cards"
    cards.mkdir()
    (cards / "gpt-heads.yaml").write_text(f"extends: gpt-tiny\nd_model: {8 * heads}\n"
                                          f"n_heads: {heads}\n")
    png = tmp_path / "map.png"
    result = CliRunner().invoke(main, ["attention", "gpt-heads", "--registry", str(cards),
                                       "--ids", "5,6,7,8,9", "--layer", "0", "-o", str(png)])
    assert result.exit_code == 0, result.output
    pixels = np.asarray(Image.open(png).convert("RGB")).astype(int)
    columns, rows = grid
    assert pixels.shape[1] / pixels.shape[0] == pytest.approx(
        columns * 4.0 / (rows * 3.5), rel=0.02)
    coloured = pixels.max(axis=2) - pixels.min(axis=2) > 60  # viridis; text and paper are grey
    wide = coloured_runs(coloured.sum(axis=0) > 20, least=60)  # heatmaps, not colour bars
    tall = coloured_runs(coloured.sum(axis=1) > 20, least=60)
    assert (len(wide), len(tall)) == grid
    assert sum(coloured[top:bottom, left:right].mean() > 0.9
               for top, bottom in tall for left, right in wide) == heads
