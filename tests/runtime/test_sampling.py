"""Token picking checked against references computed here: sampling filters by drawing from
fixed logits, beam search against an exhaustive search over a tiny vocabulary."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from runtime.sampling import Sampling, decode
from tests.support.sampling import EOS, VOCAB, PrefixSession, log_softmax, sequence_score


class FixedLogits:
    """A session whose every row sees the same logits at every step."""

    def __init__(self, logits: np.ndarray) -> None:
        self.logits = logits

    def prefill(self, ids: np.ndarray, mask: np.ndarray | None) -> np.ndarray:
        return np.tile(self.logits, (len(ids), 1))

    def step(self, token: np.ndarray) -> np.ndarray:
        return np.tile(self.logits, (len(token), 1))


def draws(logits: np.ndarray, sampling: Sampling, rows: int = 20_000) -> np.ndarray:
    """One token for each of `rows` identical prompts: `rows` independent draws."""
    ids = np.zeros((rows, 1), np.int64)
    return decode(FixedLogits(logits), ids, None, 1, sampling, eos=None)[:, 0]


def softmax(logits: np.ndarray) -> np.ndarray:
    exp = np.exp(logits - logits.max())
    return exp / exp.sum()


def assert_frequencies(tokens: np.ndarray, probs: np.ndarray) -> None:
    """Each token's count within 5 standard deviations of its binomial expectation, and
    tokens of probability zero never drawn."""
    counts = np.bincount(tokens, minlength=len(probs))
    n = len(tokens)
    for token, (count, p) in enumerate(zip(counts, probs, strict=True)):
        if p == 0:
            assert count == 0, f"token {token} lies outside the filter but was drawn"
        else:
            assert abs(count - n * p) <= 5 * np.sqrt(n * p * (1 - p)) + 1, (token, count, n * p)


LOGITS = np.log(np.array([0.30, 0.25, 0.20, 0.12, 0.08, 0.05]))


def test_temperature_sampling_draws_the_softmax() -> None:
    assert_frequencies(draws(LOGITS, Sampling(temperature=1.0, seed=1)), softmax(LOGITS))
    assert_frequencies(draws(LOGITS, Sampling(temperature=0.5, seed=2)), softmax(LOGITS / 0.5))


@pytest.mark.parametrize("k", [1, 2, 4])
def test_top_k_draws_only_the_k_most_likely_renormalised(k: int) -> None:
    probs = softmax(LOGITS)
    keep = np.argsort(-probs)[:k]
    expected = np.zeros_like(probs)
    expected[keep] = probs[keep] / probs[keep].sum()
    assert_frequencies(draws(LOGITS, Sampling(temperature=1.0, top_k=k, seed=3)), expected)


@pytest.mark.parametrize("p, nucleus", [(0.5, 2), (0.54, 2), (0.56, 3), (0.9, 5), (0.01, 1)])
def test_top_p_draws_the_smallest_prefix_reaching_p(p: float, nucleus: int) -> None:
    """Holtzman et al. 2020: the smallest set of most likely tokens whose mass is >= p.
    The nucleus sizes are worked out by hand from 0.30, 0.25, 0.20, 0.12, ..."""
    probs = softmax(LOGITS)
    expected = np.zeros_like(probs)
    expected[:nucleus] = probs[:nucleus] / probs[:nucleus].sum()
    assert_frequencies(draws(LOGITS, Sampling(temperature=1.0, top_p=p, seed=4)), expected)


def test_top_k_and_top_p_together_apply_both() -> None:
    probs = softmax(LOGITS)
    # top-k 3 keeps 0.30, 0.25, 0.20 (mass 0.75); renormalised 0.4, 0.333, 0.267: top-p 0.7
    # then keeps the first two (0.733 >= 0.7).
    expected = np.zeros_like(probs)
    expected[:2] = probs[:2] / probs[:2].sum()
    assert_frequencies(draws(LOGITS, Sampling(temperature=1.0, top_k=3, top_p=0.7, seed=5)),
                       expected)


def exhaustive_best(prompt: tuple[int, ...], length: int, eos: int | None) -> tuple[int, ...]:
    candidates = []
    for tokens in itertools.product(range(VOCAB), repeat=length):
        if eos in tokens and any(t != eos for t in tokens[tokens.index(eos):]):
            continue  # after eos only eos
        candidates.append((sequence_score(prompt, tokens, eos), tokens))
    return max(candidates)[1]


@pytest.mark.parametrize("eos", [None, EOS])
def test_beam_search_with_every_beam_kept_is_the_exhaustive_optimum(eos: int | None) -> None:
    length = 4
    prompts = [(1, 2), (3,), (4, 0, 2)]
    beams = VOCAB ** (length - 1)  # enough beams that nothing is ever pruned
    for prompt in prompts:
        found = decode(PrefixSession(), np.array([prompt]), None, length, Sampling(beams=beams),
                       eos)[0]
        assert tuple(found.tolist()) == exhaustive_best(prompt, length, eos)


def test_narrow_beams_lie_between_greedy_and_the_optimum_and_rows_are_independent() -> None:
    length, prompts = 5, [(1, 2, 3), (2, 2, 4)]
    batch = np.array(prompts)
    greedy = decode(PrefixSession(), batch, None, length, Sampling(), EOS)
    narrow = decode(PrefixSession(), batch, None, length, Sampling(beams=3), EOS)
    for row, prompt in enumerate(prompts):
        alone = decode(PrefixSession(), np.array([prompt]), None, length, Sampling(beams=3), EOS)
        np.testing.assert_array_equal(alone[0], narrow[row])
        best = sequence_score(prompt, exhaustive_best(prompt, length, EOS), EOS)
        beam = sequence_score(prompt, tuple(narrow[row].tolist()), EOS)
        assert sequence_score(prompt, tuple(greedy[row].tolist()), EOS) <= beam + 1e-9
        assert beam <= best + 1e-9


class CountingSession(PrefixSession):
    """PrefixSession that records how many rows each step is fed."""

    def __init__(self) -> None:
        super().__init__()
        self.step_rows: list[int] = []

    def step(self, token: np.ndarray) -> np.ndarray:
        self.step_rows.append(len(token))
        return super().step(token)


def fed_every_step(ids: np.ndarray, length: int, sampling: Sampling, eos: int) -> np.ndarray:
    """The reference: every row is fed every step, finished or not, and each row draws with
    Generator.choice in row order (the loop before finished rows left the batch)."""
    rng, session = np.random.default_rng(sampling.seed), PrefixSession()
    logits, done, tokens = session.prefill(ids, None), np.zeros(len(ids), bool), []
    for _ in range(length):
        if sampling.temperature == 0:
            picked = logits.argmax(axis=-1)
        else:
            probs = np.exp(log_softmax(logits / sampling.temperature))
            picked = np.array([rng.choice(VOCAB, p=row / row.sum()) for row in probs])
        token = np.where(done, eos, picked)
        done |= token == eos
        tokens.append(token)
        logits = session.step(token)
    return np.stack(tokens, axis=1)


PROMPTS = np.array([[1, 2, 3], [2, 2, 4], [3, 1, 0], [4, 4, 4], [0, 1, 2], [1, 1, 1]])


@pytest.mark.parametrize("sampling", [Sampling(), Sampling(temperature=1.5, seed=4)])
def test_finished_rows_leave_the_batch_and_tokens_do_not_change(sampling: Sampling) -> None:
    length = 12
    expected = fed_every_step(PROMPTS, length, sampling, EOS)
    session = CountingSession()
    got = decode(session, PROMPTS, None, length, sampling, EOS)
    np.testing.assert_array_equal(got, expected)
    finished_at = [list(row).index(EOS) if EOS in row else length for row in expected.tolist()]
    assert min(finished_at) < length - 1, "no row finished early: the case tests nothing"
    # Step s (feeding token s) runs only the rows whose eos, if any, comes after token s.
    live = [sum(end > s for end in finished_at) for s in range(length - 1)]
    assert session.step_rows == [n for n in live if n > 0]
    if sampling.temperature == 0:  # greedy: each row is what it is alone
        for row, prompt in enumerate(PROMPTS):
            np.testing.assert_array_equal(
                decode(PrefixSession(), prompt[None], None, length, sampling, EOS)[0], got[row])


def test_a_rows_samples_do_not_depend_on_when_other_rows_finish() -> None:
    """Row 0 finishing at once (its logits make eos certain) leaves the other rows' draws."""
    sampling, length = Sampling(temperature=1.5, seed=9), 10

    class EosFirstRow(PrefixSession):
        def prefill(self, ids: np.ndarray, mask: np.ndarray | None) -> np.ndarray:
            logits = super().prefill(ids, mask)
            if ids[0].tolist() == [5, 5, 5]:
                logits[0] = np.where(np.arange(VOCAB) == EOS, 50.0, -50.0)
            return logits

    plain = decode(EosFirstRow(), PROMPTS, None, length, sampling, EOS)
    early = decode(EosFirstRow(), np.vstack([[5, 5, 5], PROMPTS[1:]]), None, length, sampling,
                   EOS)
    assert (early[0] == EOS).all() and not (plain[0] == EOS).all()
    np.testing.assert_array_equal(early[1:], plain[1:])


def test_any_integer_is_a_seed_for_zoo_run_as_for_the_server() -> None:
    """`zoo run --seed -1` was a numpy traceback (the server's finding 1 of issue 43, at the
    depth both share): a negative seed draws as numpy's generator seeded with it modulo
    2**64 does."""
    for seed in (-1, -(10**30), 2**70 + 5):
        assert Sampling(seed=seed).generator().random() == \
            np.random.default_rng(seed % 2**64).random()
