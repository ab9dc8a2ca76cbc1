"""The prefix cache of `zoo serve` (issue 45): a prompt that begins with whole blocks of tokens
already prefilled starts from their keys/values and is fed only the rest. Checked: the match
is exact and never covers the prompt's last token (a fake session whose keys/values name the
token and position that made them); the byte bound and least-recently-used eviction; a
resumed prefix gives the logits of one pass in both loops; through the scheduler, every
request's greedy tokens are those of its prompt alone through `zoo run`'s generate (no
cache) whatever was cached before, in the plain loop (gpt-tiny) and the --optimize
shared-cache loop (llama-tiny), and the hit and missed tokens are counted exactly; /metrics
exposes the counters and `--prefix-cache-mb 0` turns the cache off."""

from __future__ import annotations

import threading
from pathlib import Path

import numpy as np
import pytest
from tokenizers import Tokenizer

from registry.sizes import cache_shape
from runtime.generate import left_padded, open_session
from runtime.opening import open_export
from runtime.sampling import Sampling
from runtime.serve.prefix_cache import ROOT, PrefixCache, resumed
from runtime.serve.scheduler import Job, Scheduler
from tests.conftest import SharedExport, on_shared
from tests.support.serve import Collected, Server, alone, scrape, with_tokenizer

pytestmark = on_shared("gpt-tiny")

BLOCK = 4  # small blocks: many block boundaries in short prompts


class Named:
    """A session of one (two-input) cache whose keys/values at a row's position p are
    (that row's token at p, p): a block's values say which tokens made them."""

    def __init__(self, prompts: list[list[int]]) -> None:
        self.rows = [np.array([[[token, position] for position, token in enumerate(prompt)]],
                              np.float32) for prompt in prompts]  # (heads 1, length, 2)

    def keys_values(self, row: int, start: int, stop: int) -> list[np.ndarray]:
        return [self.rows[row][:, start:stop], -self.rows[row][:, start:stop]]


def matched(cache: PrefixCache, prompt: list[int]) -> int:
    """The tokens the cache serves for the prompt, checked to be the prompt's own."""
    past = cache.lookup(prompt)
    if past is None:
        return 0
    length = past[0].shape[2]
    assert past[0].shape == past[1].shape == (1, 1, length, 2)
    assert past[0][0, 0, :, 0].tolist() == prompt[:length]  # made by these very tokens
    assert past[0][0, 0, :, 1].tolist() == list(range(length))  # at these positions
    np.testing.assert_array_equal(past[1], -past[0])
    return length


def test_a_match_is_exact_on_token_ids_and_short_of_the_last_token() -> None:
    cache = PrefixCache(10**6, BLOCK)
    cached = list(range(10, 30))  # 20 tokens: 5 whole blocks stored
    cache.store(cached, Named([cached]), 0)
    changed = lambda index: [*cached[:index], 99, *cached[index + 1:]]  # noqa: E731
    cases = {  # prompt: tokens served
        "equal to the cached one": (cached, 16),  # not its last block: its last token's
        "a prefix of it, a block and one": (cached[:9], 8),
        "a prefix of it, two blocks": (cached[:8], 4),  # its last token is in block 2
        "sharing 3 blocks, then others": (cached[:12] + [99] * 5, 12),
        "its 12th token (a block's last) changed": (changed(11), 8),
        "its 9th token (a block's first) changed": (changed(8), 8),
        "its first token changed": (changed(0), 0),
        "shorter than a block": (cached[:3], 0),
    }
    for name, (prompt, tokens) in cases.items():
        assert matched(cache, prompt) == tokens, name
    hits, misses, held, _ = cache.stats()
    assert hits == sum(tokens for _, tokens in cases.values())
    assert misses == sum(len(prompt) - tokens for prompt, tokens in cases.values())
    assert held == 5 * 2 * BLOCK * 2 * 4  # 5 blocks of 2 inputs, BLOCK x 2 float32s each


def test_the_bound_holds_and_the_least_recently_used_goes_first() -> None:
    size = 2 * BLOCK * 2 * 4  # a block's bytes
    cache = PrefixCache(6 * size, BLOCK)
    chains = {name: list(range(start, start + 3 * BLOCK + 1))
              for name, start in (("p", 10), ("q", 50), ("r", 90))}  # 3 whole blocks each

    def store(name: str, prompt: list[int] | None = None) -> None:
        prompt = prompt or chains[name]
        cache.store(prompt, Named([prompt]), 0)
        assert cache.stats()[2] <= cache.limit  # never above the bound
        held = {block.id for block in cache.blocks.values()}
        assert {parent for parent, _ in cache.blocks} <= held | {ROOT}  # no orphan

    store("p")
    store("q")
    assert cache.stats()[2] == 6 * size  # full
    assert matched(cache, chains["p"]) == 3 * BLOCK  # p used: q is the least recent
    store("r")  # needs 3 blocks: q's last three go, its last first
    assert [matched(cache, chains[name]) for name in "pqr"] == [3 * BLOCK, 0, 3 * BLOCK]
    assert cache.stats()[2] == 6 * size
    store("q", chains["q"][:BLOCK + 1])  # 1 block: p is now the least recent, its end goes
    assert [matched(cache, chains[name]) for name in "pqr"] == [2 * BLOCK, BLOCK, 3 * BLOCK]
    long = list(range(130, 130 + 10 * BLOCK))  # longer than the bound: its first 6 kept
    store("long", long)
    assert matched(cache, long) == 6 * BLOCK
    assert [matched(cache, chains[name]) for name in "pqr"] == [0, 0, 0]
    tiny = PrefixCache(size - 1, BLOCK)  # less than a block: nothing kept
    tiny.store(long, Named([long]), 0)
    assert tiny.stats()[2] == 0 and tiny.lookup(long) is None


LOOPS = [("gpt-tiny", "plain"), ("llama-tiny", "optimize")]  # llama: GQA, rotary positions


@pytest.mark.parametrize(("name", "variant"), LOOPS)
def test_a_resumed_prefix_gives_the_logits_of_one_pass(shared_export: SharedExport, name: str,
                                                      variant: str) -> None:
    """Keys/values stored from a left-padded row of a batch's prefill, resumed and fed the
    rest of another prompt: its next-token logits are those of its own one-pass prefill."""
    runtime = open_export(shared_export(name, variant)[0])
    rng = np.random.default_rng(1)
    short, long = rng.integers(3, 250, 9).tolist(), rng.integers(3, 250, 23).tolist()
    ids, mask = left_padded([long, short], 0)
    session = open_session(runtime, ids.shape[1] + 1)
    session.prefill(ids, mask)
    cache = PrefixCache(10**7, BLOCK)
    cache.store(long, session, 0)
    cache.store(short, session, 1)  # 14 columns of padding before it in the plain loop
    other = 3 if long[19] != 3 else 4  # long's 20th token (block 5's last) changed
    for prompt, served in ((short[:8] + [7, 8, 9], 8), (long[:21] + [5], 20), (short, 8),
                           (long[:19] + [other, 5, 6], 16)):
        resumed_session, fed = resumed(cache, runtime, prompt)
        assert fed == served
        logits = resumed_session.extend(np.array([prompt[fed:]]))
        whole = open_session(runtime, len(prompt) + 1).prefill(np.array([prompt]), None)
        np.testing.assert_allclose(logits, whole, atol=1e-4)


def tokens_of(sink: Collected) -> list[int]:
    assert sink.finished.wait(120), "a request never finished"
    (name, completion), = [event for event in sink.events if event[0] != "piece"]
    assert name == "done", sink.events
    return completion.ids


@pytest.mark.parametrize(("name", "variant"), LOOPS)
def test_tokens_are_those_of_the_prompt_alone_whatever_was_cached(
        shared_export: SharedExport, name: str, variant: str) -> None:
    """Two waves. The first fills the cache (left-padded together, a long one chunked). The
    second joins while a row of the first still decodes: prompts sharing 1, 2, 3 and 17
    blocks with a cached one, one equal to it, one a prefix of it, one differing in its last
    cached token, misses beside a hit in one step, long prompts whose rest is chunked."""
    runtime = open_export(shared_export(name, variant)[0])
    cache = PrefixCache(10**7, BLOCK)
    scheduler = Scheduler(runtime, 8, lambda ids: "x" * len(ids), "test", prefill_chunk=64,
                          prefix_cache=cache)
    pool = iter(np.random.default_rng(4).permutation(np.arange(3, 256)).tolist())
    fresh = lambda n: [next(pool) for _ in range(n)]  # noqa: E731  tokens never seen before
    system, long = fresh(10), fresh(80)
    a, b = system + fresh(3), system + fresh(7)
    first = [(a, 12), (b, 4), (fresh(6), 5), (long, 5)]  # the long one: chunks of 64 and 16
    second = [  # (prompt, max_tokens, tokens served from the cache)
        (system + fresh(5), 6, 8),  # shares the system prompt's 2 whole blocks
        (a, 5, 12),  # equal to a cached prompt: all but its last (partial) block
        (b[:9], 4, 8),  # a prefix of a cached prompt
        (b[:11] + fresh(1) + b[12:], 7, 8),  # its 12th token, block 3's last, differs
        (fresh(7), 3, 0), (fresh(11), 6, 0),  # misses, left-padded beside the hit above
        (long[:70] + fresh(10), 5, 68),  # chunked (80 > 64): its 12 left in one step
        (long[:6] + fresh(70), 4, 4),  # its 72 left in two chunks after the cached block
    ]
    requests = first + [(prompt, tokens) for prompt, tokens, _ in second]
    expected = [alone(runtime, prompt, tokens, Sampling()) for prompt, tokens in requests]
    sinks = [Collected() for _ in requests]
    assert len(expected[0]) == 12  # no eos before the second wave comes
    reached, go = threading.Event(), threading.Event()

    def holds_at_its_8th_token(event: tuple) -> None:  # on the scheduler's thread
        sinks[0](event)
        if len(jobs[0].tokens) == 8:
            reached.set()
            go.wait(60)

    jobs = [Job(prompt, tokens, Sampling(), (), index == 0,  # a streams: an event a token
                holds_at_its_8th_token if index == 0 else sinks[index])
            for index, (prompt, tokens) in enumerate(requests)]
    with scheduler.wake:  # its thread takes none of them until all are queued
        for job in jobs[:len(first)]:
            scheduler.submit(job)
    assert reached.wait(60)
    assert all(job.tokens for job in jobs[:len(first)])  # every first-wave prompt stored
    before = cache.stats()
    with scheduler.wake:
        for job in jobs[len(first):]:
            scheduler.submit(job)
    go.set()
    for index, (sink, want) in enumerate(zip(sinks, expected, strict=True)):
        assert tokens_of(sink) == want, f"request {index}: {requests[index][0]}"
    hits, misses, held, _ = cache.stats()
    assert before[:2] == (0, sum(len(prompt) for prompt, _ in first))
    assert hits == sum(served for _, _, served in second)
    assert misses - before[1] == sum(len(prompt) - served for prompt, _, served in second)
    assert 0 < held <= cache.limit


def test_metrics_count_hits_and_misses_and_0_turns_the_cache_off(
        shared_export: SharedExport, tmp_path: Path) -> None:
    folder = with_tokenizer(shared_export("gpt-tiny")[0], tmp_path / "chat")
    runtime = open_export(folder)
    tokenizer = Tokenizer.from_file(str(folder / "tokenizer.json"))
    rng = np.random.default_rng(6)
    cached = rng.integers(3, 250, 40).tolist()
    prompts = [cached, cached[:35] + rng.integers(3, 250, 5).tolist(), cached]
    expected = [tokenizer.decode(alone(runtime, prompt, 6, Sampling())) for prompt in prompts]
    model = (("model", "chat"),)
    for megabytes in ("1", "0"):
        server = Server([folder], tmp_path / f"serve-{megabytes}.log", "--prefix-cache-mb",
                        megabytes)
        try:
            for prompt, text in zip(prompts, expected, strict=True):
                status, reply = server.request("/v1/completions", {
                    "model": "chat", "prompt": prompt, "max_tokens": 6, "temperature": 0})
                assert status == 200 and reply["choices"][0]["text"] == text, reply
            samples = scrape(server)
        finally:
            assert server.stop() == 0
        cache = {key[0]: value for key, value in samples.items()
                 if key[0].startswith("zoo_prefix_cache") and key[1] == model}
        if megabytes == "0":
            assert cache == {}
            continue
        # 16-token blocks: the first prompt stores 2; the others are served both (32 tokens)
        block = 2 * runtime.card["n_layers"] * np.prod(cache_shape(runtime.card, 1, 16)) * 4
        assert cache == {"zoo_prefix_cache_hit_tokens_total": 64,
                         "zoo_prefix_cache_miss_tokens_total": 3 * 40 - 64,
                         "zoo_prefix_cache_bytes": 2 * block,
                         "zoo_prefix_cache_limit_bytes": 2**20}

