"""`zoo plot` and OUT/metrics.jsonl: the pictures hold the model's numbers (checked against the
papers' formulas written out here), decode to the size asked for, and bad input is one line."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from matplotlib.image import imread

from tests.conftest import card, modules_loaded
from tests.support.helpers import assert_one_line_error, zoo
from zoo.assemble import build_model
from zoo.files.weights import load_built, save_built
from zoo.plots.draw import CHART_SIZE, DPI, HEATMAP_SIZE, Panel, heatmap_grid
from zoo.plots.positions import plot_positions
from zoo.plots.schedule import plot_schedule
from zoo.plots.training import plot_training
from zoo.training.metrics import METRICS
from zoo.training.train import TrainOptions, train

ROOT = Path(__file__).resolve().parents[2]


def png_size(path: Path) -> tuple[int, int]:
    height, width = imread(path).shape[:2]  # decodes the file: a broken PNG fails here
    return width, height


def paper_sinusoids(positions: int, d_model: int) -> np.ndarray:
    """Vaswani et al. 2017, 3.5: PE(pos, 2i) = sin(pos / 10000^(2i/d)), PE(pos, 2i+1) = cos."""
    table = np.zeros((positions, d_model))
    for pos in range(positions):
        for i in range(d_model // 2):
            angle = pos / 10000 ** (2 * i / d_model)
            table[pos, 2 * i], table[pos, 2 * i + 1] = np.sin(angle), np.cos(angle)
    return table


def test_sinusoidal_table_drawn_is_the_papers_formula(tmp_path: Path) -> None:
    tiny = card("transformer-tiny")
    drawn = plot_positions("transformer-tiny", tmp_path / "pe.png")
    assert drawn.panels == 1
    expected = paper_sinusoids(tiny["max_positions"], tiny["d_model"])
    np.testing.assert_allclose(drawn.images[0], expected, atol=1e-6)
    size = (round(HEATMAP_SIZE[0] * DPI), round(HEATMAP_SIZE[1] * DPI))
    assert drawn.size == size and png_size(tmp_path / "pe.png") == size


def test_learned_table_of_a_model_folder_is_its_weights(tmp_path: Path) -> None:
    tiny = card("gpt-tiny")
    save_built(build_model(tiny, seed=5), tiny, tmp_path / "model")
    drawn = plot_positions(str(tmp_path / "model"), tmp_path / "pe.png", positions=16)
    model, _ = load_built(tmp_path / "model")
    weights = model.embeddings.position.table.weight.detach().numpy()
    assert drawn.panels == 1
    np.testing.assert_array_equal(drawn.images[0], weights[:16])  # the first 16 positions
    assert png_size(tmp_path / "pe.png") == drawn.size


def test_rotary_angles_are_position_times_the_papers_frequencies(tmp_path: Path) -> None:
    (tmp_path / "cards").mkdir()
    (tmp_path / "cards" / "gpt-rope.yaml").write_text("extends: gpt-tiny\nposition: rotary\n"
                                                      "rope_theta: 500.0\n")
    drawn = plot_positions("gpt-rope", tmp_path / "rope.png", registries=(str(tmp_path / "cards"),))
    rope = card("gpt-tiny")
    head_dim = rope["d_model"] // rope["n_heads"]
    # Su et al. 2021: theta_i = base^(-2i/d) for i < d/2, rotated by m * theta_i at position m
    frequencies = 500.0 ** (-2 * np.arange(head_dim // 2) / head_dim)
    angles = np.arange(rope["max_positions"])[:, None] * frequencies
    assert drawn.panels == 2  # the angles and their cosines
    np.testing.assert_allclose(drawn.images[0], angles, rtol=1e-6)
    np.testing.assert_allclose(drawn.images[1], np.cos(angles), atol=1e-4)
    assert png_size(tmp_path / "rope.png") == (round(2 * HEATMAP_SIZE[0] * DPI),
                                               round(HEATMAP_SIZE[1] * DPI))


def test_heatmap_grid_lays_out_panels_in_rows(tmp_path: Path) -> None:
    panels = [Panel(np.full((3, 4), float(k)), f"head {k}", x_labels=list("abcd"),
                    y_labels=list("xyz")) for k in range(5)]
    drawn = heatmap_grid(panels, tmp_path / "grid.png", columns=3, shared_scale=True)
    assert drawn.panels == 5
    assert [float(image[0, 0]) for image in drawn.images] == [0, 1, 2, 3, 4]
    size = (round(3 * HEATMAP_SIZE[0] * DPI), round(2 * HEATMAP_SIZE[1] * DPI))
    assert drawn.size == size and png_size(tmp_path / "grid.png") == size


def test_noam_peaks_at_the_warmup_with_the_papers_value(tmp_path: Path) -> None:
    drawn = plot_schedule(card("transformer-tiny"), tmp_path / "lr.png", warmups=[4000, 8000],
                          d_models=[512, 256], steps=20000)
    assert drawn.panels == 1
    curves = drawn.lines[0]
    assert len(curves) == 4
    for d_model in (512, 256):
        for warmup in (4000, 8000):
            steps, rates = curves[f"d_model {d_model}, warmup {warmup}"]
            np.testing.assert_array_equal(steps, np.arange(1, 20001))
            assert steps[np.argmax(rates)] == warmup
            assert rates.max() == pytest.approx(d_model**-0.5 * warmup**-0.5, rel=1e-12)
            step = np.array([1, 100, 12345, 20000])  # and elsewhere: the paper's lrate
            paper = d_model**-0.5 * np.minimum(step**-0.5, step * warmup**-1.5)
            np.testing.assert_allclose(rates[step - 1], paper, rtol=1e-12)
    assert png_size(tmp_path / "lr.png") == (round(CHART_SIZE[0] * DPI),
                                             round(CHART_SIZE[1] * DPI))


def test_schedule_defaults_follow_zoo_train(tmp_path: Path) -> None:
    tiny = card("transformer-tiny")  # noam, warm-up 400, factor 1, the card's d_model
    (steps, rates), = plot_schedule(tiny, tmp_path / "noam.png").lines[0].values()
    assert steps[np.argmax(rates)] == 400 and len(steps) == 2000
    assert rates.max() == pytest.approx(tiny["d_model"] ** -0.5 * 400**-0.5, rel=1e-12)
    drawn = plot_schedule(card("gpt-tiny"), tmp_path / "cosine.png", steps=300)
    (steps, rates), = drawn.lines[0].values()  # cosine: peak 1e-3 at step 100, then 10%
    assert steps[np.argmax(rates)] == 100 and rates.max() == pytest.approx(1e-3)
    assert rates[-1] == pytest.approx(1e-4)


def options(out: Path, **overrides: object) -> TrainOptions:
    base = {"task": "lm", "out": out, "steps": 12, "batch_size": 4, "block_size": 16,
            "checkpoint_every": 6, "seed": 1}
    return TrainOptions(**{**base, **overrides})


def read_lines(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / METRICS).read_text().splitlines()]


def test_metrics_jsonl_has_a_line_per_logged_step_and_the_curves_draw_it(tmp_path: Path) -> None:
    tiny = card("gpt-tiny")
    logged = []
    train(build_model(tiny), tiny, options(tmp_path / "run"),
          lambda step, total, loss, lr, rate: logged.append((step, loss, lr)), log_every=5)
    lines = read_lines(tmp_path / "run")
    assert [(line["step"], line["loss"], line["lr"]) for line in lines] == logged
    assert [line["step"] for line in lines] == [5, 10, 12]  # and the last step
    assert all(line["tokens_per_s"] > 0 for line in lines)
    drawn = plot_training(tmp_path / "run", tmp_path / "curves.png")
    assert drawn.panels == 2
    steps = [line["step"] for line in lines]
    for panel, key in zip(drawn.lines, ("loss", "lr"), strict=True):
        x, y = panel[key]
        assert x.tolist() == steps and y.tolist() == [line[key] for line in lines]
    assert png_size(tmp_path / "curves.png") == (round(CHART_SIZE[0] * DPI),
                                                 round(2 * CHART_SIZE[1] * DPI))


class Interrupt(Exception):
    pass


def test_resumed_run_continues_metrics_without_duplicate_steps(tmp_path: Path) -> None:
    tiny = card("gpt-tiny")
    train(build_model(tiny, seed=1), tiny, options(tmp_path / "whole"), log_every=1)

    def stop_after_9(step: int, *rest: float) -> None:
        if step >= 9:
            raise Interrupt  # killed after logging step 9; the last checkpoint is step 6

    with pytest.raises(Interrupt):
        train(build_model(tiny, seed=1), tiny, options(tmp_path / "cut"), stop_after_9,
              log_every=1)
    assert [line["step"] for line in read_lines(tmp_path / "cut")] == list(range(1, 10))
    train(build_model(tiny, seed=1), tiny, options(tmp_path / "cut", resume=True), log_every=1)
    whole, cut = read_lines(tmp_path / "whole"), read_lines(tmp_path / "cut")
    assert [line["step"] for line in cut] == list(range(1, 13))
    assert [(a["loss"], a["lr"]) for a in cut] == [(b["loss"], b["lr"]) for b in whole]


def test_force_starts_the_metrics_afresh(tmp_path: Path) -> None:
    run = ["train", "gpt-tiny", "--task", "lm", "--steps", "3", "--batch-size", "2",
           "--block-size", "16", "-o", str(tmp_path / "run")]
    assert zoo(*run).exit_code == 0
    result = zoo(*run, "--force")
    assert result.exit_code == 0, result.output
    assert [line["step"] for line in read_lines(tmp_path / "run")] == [3]  # the last step
    result = zoo("plot", "training", str(tmp_path / "run"), "-o", str(tmp_path / "c.png"))
    assert result.exit_code == 0, result.output
    assert result.stdout == f"wrote {tmp_path / 'c.png'}\n"


def test_commands_write_the_png_they_name(tmp_path: Path) -> None:
    for args in (["positions", "transformer-tiny"], ["schedule", "transformer-tiny",
                                                     "--warmup", "40", "--warmup", "80"]):
        target = tmp_path / f"{args[0]}.png"
        result = zoo("plot", *args, "-o", str(target))
        assert result.exit_code == 0, result.output
        assert result.stdout == f"wrote {target}\n"
        assert png_size(target)[0] > 0
        again = zoo("plot", *args, "-o", str(target), "--force")
        assert again.exit_code == 0, again.output


BAD = [
    (["positions", "gpt-tiny", "-o", "{tmp}/file.txt/pe.png"], "is not a folder"),
    (["positions", "gpt-tiny", "-o", "{tmp}/old.png"], "already exists"),
    (["positions", "gpt-tiny", "-o", "{tmp}/pe.jpg"], "expected a .png"),
    (["positions", "no-such-card", "-o", "{tmp}/pe.png"], "unknown card 'no-such-card'"),
    (["positions", "{tmp}/broken", "-o", "{tmp}/pe.png"], "config.yaml"),
    (["positions", "gpt-tiny", "--positions", "0", "-o", "{tmp}/pe.png"], "--positions 0"),
    (["positions", "gpt-tiny", "--positions", "129", "-o", "{tmp}/pe.png"], "1 to 128"),
    (["training", "{tmp}/empty", "-o", "{tmp}/c.png"], "no metrics.jsonl"),
    (["training", "{tmp}/missing", "-o", "{tmp}/c.png"], "no such folder"),
    (["training", "{tmp}/garbled", "-o", "{tmp}/c.png"], "line 2: expected JSON"),
    (["schedule", "gpt-tiny", "--warmup", "0", "-o", "{tmp}/lr.png"], "--warmup 0: should be"),
    (["schedule", "gpt-tiny", "--warmup", "-5", "-o", "{tmp}/lr.png"], "--warmup -5"),
    (["schedule", "gpt-tiny", "--warmup", "ten", "-o", "{tmp}/lr.png"], "expected a whole"),
    (["schedule", "gpt-tiny", "--warmup", "500", "--steps", "300", "-o", "{tmp}/lr.png"],
     "longer than --steps 300"),
    (["schedule", "gpt-tiny", "--d-model", "64", "-o", "{tmp}/lr.png"], "only noam"),
    (["schedule", "no-such-card", "-o", "{tmp}/lr.png"], "unknown card"),
]


@pytest.mark.parametrize("args, message", BAD, ids=[" ".join(a[:3]) for a, _ in BAD])
def test_bad_input_is_one_line_exit_2_and_writes_nothing(args: list[str], message: str,
                                                         tmp_path: Path) -> None:
    (tmp_path / "file.txt").write_text("a file, not a folder")
    (tmp_path / "old.png").write_bytes(b"an earlier picture")
    (tmp_path / "empty").mkdir()
    (tmp_path / "broken").mkdir()
    (tmp_path / "broken" / "config.yaml").write_text("family: [decoder\n")
    (tmp_path / "garbled").mkdir()
    (tmp_path / "garbled" / METRICS).write_text('{"step": 1, "loss": 2.0, "lr": 0.1}\n{"st\n')
    before = sorted((p.relative_to(tmp_path), p.read_bytes() if p.is_file() else None)
                    for p in tmp_path.rglob("*"))
    result = zoo("plot", *[a.format(tmp=tmp_path) for a in args])
    assert_one_line_error(result, message)
    after = sorted((p.relative_to(tmp_path), p.read_bytes() if p.is_file() else None)
                   for p in tmp_path.rglob("*"))
    assert after == before  # nothing written, not even a temporary file


def test_list_and_show_do_not_import_matplotlib() -> None:
    calls = [["list"], ["show", "gpt-tiny"], ["plot", "--help"]]
    assert modules_loaded(calls, ("matplotlib", "torch")) == []


def test_a_card_is_drawn_as_built_with_seed_0(tmp_path: Path) -> None:
    weights = build_model(card("gpt-tiny"), seed=0).embeddings.position.table.weight
    drawn = plot_positions("gpt-tiny", tmp_path / "pe.png").images[0]
    assert torch.equal(torch.tensor(drawn).float(), weights.detach())
