"""`zoo train moe-tiny --task lm`: the router's load-balancing loss is transformers' (Switch
Transformer's), it is added to the loss times the card's coefficient, and metrics.jsonl holds
it and the experts' load."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from tests.conftest import card
from tests.support.helpers import zoo
from zoo.assemble import build_model
from zoo.training.experts import expert_load, load_balancing_loss
from zoo.training.train import TrainOptions, train

transformers = pytest.importorskip("transformers")


@pytest.mark.parametrize("n_experts, k", [(4, 2), (8, 1), (6, 3)])
def test_the_router_loss_is_transformers_load_balancing_loss(n_experts: int, k: int) -> None:
    from transformers.models.mixtral.modeling_mixtral import load_balancing_loss_func

    generator = torch.Generator().manual_seed(n_experts)
    layers = tuple(torch.randn(30, n_experts, generator=generator) * 2 for _ in range(3))
    expected = load_balancing_loss_func(layers, n_experts, k)
    torch.testing.assert_close(load_balancing_loss(layers, n_experts, k), expected)


def test_the_load_is_each_experts_share_of_the_choices() -> None:
    logits = torch.tensor([[3.0, 2.0, 0.0, 1.0], [0.0, 2.0, 3.0, 1.0], [3.0, 0.0, 2.0, 1.0]])
    # top 2 of each row: {0, 1}, {2, 1}, {0, 2}: experts 0, 1, 2 twice each, 3 never
    assert expert_load(logits, 2) == pytest.approx([1 / 3, 1 / 3, 1 / 3, 0.0], abs=1e-4)


def _first_loss(tmp_path: Path, coefficient: float) -> tuple[float, list[dict]]:
    tiny = card("moe-tiny", router_aux_loss_coef=coefficient)
    out = tmp_path / f"coef-{coefficient}"
    state = train(build_model(tiny), tiny, TrainOptions(
        task="lm", out=out, steps=2, batch_size=4, block_size=32, seed=3), log_every=1)
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    return state["losses"][0], records


def test_the_router_loss_is_added_with_its_coefficient(tmp_path: Path) -> None:
    """The same first step with the coefficient at 0 and at 0.5: the losses differ by half the
    router loss that step logs (the same weights, batch and routing)."""
    without, _ = _first_loss(tmp_path, 0.0)
    with_loss, records = _first_loss(tmp_path, 0.5)
    router = records[0]["router_loss"]
    assert router > 1.0  # n_experts * sum f P: k (here 2) at an even load, never near 0
    assert with_loss - without == pytest.approx(0.5 * router, abs=1e-5)


def test_zoo_train_writes_the_router_loss_and_the_experts_load(tmp_path: Path) -> None:
    out = tmp_path / "trained"
    result = zoo("train", "moe-tiny", "--task", "lm", "--steps", "10", "--batch-size", "4",
                 "--block-size", "32", "-o", str(out))
    assert result.exit_code == 0, result.output
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert records and all("router_loss" in record for record in records)
    tiny = card("moe-tiny")
    for record in records:
        load = record["expert_load"]
        assert len(load) == tiny["n_layers"]  # both layers sparse
        assert all(len(layer) == tiny["n_experts"] for layer in load)
        assert all(sum(layer) == pytest.approx(1.0, abs=1e-3) for layer in load)
    plain = zoo("train", "llama-tiny", "--task", "lm", "--steps", "10", "--batch-size", "2",
                "--block-size", "16", "-o", str(tmp_path / "dense"))
    assert plain.exit_code == 0, plain.output
    dense = json.loads((tmp_path / "dense" / "metrics.jsonl").read_text().splitlines()[0])
    assert "router_loss" not in dense and "expert_load" not in dense


class Interrupt(Exception):
    pass


def test_a_resumed_run_has_the_uninterrupted_losses_router_loss_included(tmp_path: Path) -> None:
    tiny = card("moe-tiny")

    def options(out: Path, **more: object) -> TrainOptions:
        return TrainOptions(task="lm", out=out, steps=6, batch_size=4, block_size=32, seed=3,
                            checkpoint_every=3, **more)

    whole = train(build_model(tiny, seed=3), tiny, options(tmp_path / "whole"))

    def stop_after_4(step: int, *rest: float) -> None:
        if step >= 4:
            raise Interrupt

    with pytest.raises(Interrupt):
        train(build_model(tiny, seed=3), tiny, options(tmp_path / "cut"), stop_after_4,
              log_every=1)
    resumed = train(build_model(tiny, seed=99), tiny, options(tmp_path / "cut", resume=True))
    assert resumed["losses"] == whole["losses"]
