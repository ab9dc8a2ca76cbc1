"""Batched generation where rows finish early (issue #14): finished rows leave the batch, in
the plain loop and the shared-cache loop, and every row keeps the tokens it has alone.

Not sampling-vs-alone: a seeded batch draws per prompt index, so a row matches itself alone
only under greedy; tests/runtime/test_sampling.py checks that draws ignore other rows finishing."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from export.opening import open_export
from runtime.generate import generate, open_session
from runtime.sampling import Sampling, decode
from runtime.sessions import Runtime
from runtime.shared_cache import SharedCacheSession
from tests.conftest import SharedExport, card, on_shared

pytestmark = on_shared("gpt-tiny")

STEPS = 20
PAD = card("gpt-tiny")["pad_token_id"]


class CountingEngine:
    """Runtime's plain graph, recording the batch size of every run's feeds."""

    def __init__(self, runtime: Runtime) -> None:
        self.runtime, self.card, self.family, self.rows = runtime, runtime.card, runtime.family, []
        self.spec = runtime.spec

    def run(self, file: str, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        self.rows.append(len(feeds["input_ids"]))
        return self.runtime.run(file, feeds)


def left_padded(prompts: list[list[int]]) -> tuple[np.ndarray, np.ndarray]:
    width = max(map(len, prompts))
    ids = np.array([[PAD] * (width - len(p)) + p for p in prompts])
    mask = np.array([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
    return ids, mask


def early_eos(alone: list[np.ndarray]) -> int:
    """A token greedy reaches early in some rows and never in another (random weights: no
    real eos), so the batch really shrinks and really keeps going."""
    for token in dict.fromkeys(np.concatenate(alone).tolist()):
        ends = [list(row).index(token) if token in row else STEPS for row in alone]
        if min(ends) < STEPS // 2 and max(ends) == STEPS:
            return token
    raise AssertionError("no token ends some rows early and leaves another running")


@pytest.fixture(scope="module")
def case(shared_export: SharedExport) -> dict[str, Any]:
    runtime = open_export(shared_export("gpt-tiny", "optimize")[0])
    rng = np.random.default_rng(5)
    prompts = [rng.integers(3, 250, n).tolist() for n in (3, 11, 6, 1, 9, 4)]
    free = [generate(runtime, np.array([p]), None, STEPS, shared_cache=False)[0]
            for p in prompts]
    eos = early_eos(free)
    alone = np.stack([generate(runtime, np.array([p]), None, STEPS, eos=eos, shared_cache=False)[0]
                      for p in prompts])
    ends = [list(row).index(eos) if eos in row else STEPS for row in alone.tolist()]
    # Step s feeds token s (s = 0 .. STEPS-2) to the rows whose eos comes later.
    live = [n for n in (sum(end > s for end in ends) for s in range(STEPS - 1)) if n]
    return {"runtime": runtime, "prompts": prompts, "eos": eos, "alone": alone, "live": live}


def test_plain_loop_feeds_only_unfinished_rows(case: dict[str, Any]) -> None:
    engine = CountingEngine(case["runtime"])
    ids, mask = left_padded(case["prompts"])
    got = generate(engine, ids, mask, STEPS, eos=case["eos"])
    np.testing.assert_array_equal(got, case["alone"])
    assert engine.rows == [len(ids), *case["live"]]


def test_shared_cache_loop_runs_only_unfinished_rows(case: dict[str, Any]) -> None:
    ids, mask = left_padded(case["prompts"])
    session = open_session(case["runtime"], ids.shape[1] + STEPS)
    assert isinstance(session, SharedCacheSession)
    rows, run = [], session._run

    def counted() -> np.ndarray:
        rows.append(int(session.values[0].shape()[0]))  # the cache rows bound to the graph
        return run()

    session._run = counted
    got = decode(session, ids, mask, STEPS, Sampling(), case["eos"])
    np.testing.assert_array_equal(got, case["alone"])
    assert rows == [len(ids), *case["live"]]


def test_seeded_sampling_with_rows_leaving_is_the_same_in_both_loops(
        case: dict[str, Any]) -> None:
    ids, mask = left_padded(case["prompts"])
    sampling = Sampling(temperature=1.2, top_k=20, seed=3)
    fast = generate(case["runtime"], ids, mask, STEPS, sampling, case["eos"])
    plain = generate(case["runtime"], ids, mask, STEPS, sampling, case["eos"], False)
    np.testing.assert_array_equal(fast, plain)
    np.testing.assert_array_equal(fast, generate(case["runtime"], ids, mask, STEPS, sampling,
                                                 case["eos"]))
