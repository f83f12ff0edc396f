"""The prefix cache: greedy tokens equal the uncached ones, LRU under a byte cap, pins and cancels."""

from __future__ import annotations

import numpy as np
import onnx
import pytest

from ortpilot.decode import BatchedLoop, Generator, Scheduler
from ortpilot.decode.options import EngineOptions
from ortpilot.decode.prefix_cache import MIN_REST, PrefixCache
from ortpilot.errors import UsageError

BLOCK = 8
RNG = np.random.default_rng(11)
SYSTEM = RNG.integers(1, 256, size=40).tolist()  # a shared "system prompt": 5 blocks
PROMPTS = [SYSTEM + RNG.integers(1, 256, size=n).tolist() for n in (3, 1, 12, 0, 7, 25)]
NEW = [10, 6, 12, 8, 9, 5]


@pytest.fixture(scope="module")
def gen(fused_decoder: onnx.ModelProto) -> Generator:
    return Generator(fused_decoder)


@pytest.fixture(scope="module")
def reference(gen: Generator) -> list[list[int]]:
    return [gen.generate(p, n, speculation="off").tokens[0] for p, n in zip(PROMPTS, NEW)]


def _options(cache_bytes: int) -> EngineOptions:
    return EngineOptions(prefix_cache_bytes=cache_bytes, prefix_block=BLOCK, speculation="off")


@pytest.mark.parametrize("prefill_chunk", [0, 4])
def test_greedy_tokens_with_the_cache_equal_those_without(
    gen: Generator, reference: list[list[int]], prefill_chunk: int
) -> None:
    scheduler = Scheduler(gen, max_streams=2, max_length=96, prefill_chunk=prefill_chunk, options=_options(1 << 20))
    streams = [scheduler.submit(p, n) for p, n in zip(PROMPTS, NEW)]
    scheduler.run_until_idle()
    assert [s.tokens for s in streams] == reference
    c = scheduler.counters()
    cache = c["prefix_cache"]
    # The first two were admitted together (both missed); every later one reused the system prompt's blocks.
    assert cache["misses"] == 2 and cache["hits"] == 4 and cache["hit_tokens"] >= 4 * 32
    assert c["prefill_tokens"] == sum(map(len, PROMPTS)) - cache["hit_tokens"]
    assert scheduler.cache.pinned == 0  # every request's pins released once its prefill was done


def test_a_hit_leaves_two_tokens_to_prefill_and_rows_are_bit_identical(gen: Generator) -> None:
    session, sig = gen.vsession.session, gen.signature
    loop = BatchedLoop(session, sig, 2, 96)
    cache = PrefixCache(1 << 20, BLOCK, loop.token_bytes)
    loop.prefill(0, SYSTEM)
    assert cache.store(loop, 0, SYSTEM) == 5 and cache.blocks == 5
    exact = SYSTEM + [7]  # the cached prefix plus one token: a lone-token chunk would round differently
    match = cache.lookup(exact)
    assert match.tokens == 32 and len(exact) - match.tokens >= MIN_REST
    cache.load(loop, 1, match)
    cached = loop.prefill(1, exact[match.tokens :], match.tokens).copy()
    cache.release(match)
    whole = BatchedLoop(session, sig, 1, 96).prefill(0, exact)  # the same prompt prefilled in one run
    assert np.array_equal(cached, whole)
    assert cache.pinned == 0 and cache.stats()["hits"] == 1


def test_lru_eviction_under_the_byte_cap_keeps_chains_whole(gen: Generator) -> None:
    loop = BatchedLoop(gen.vsession.session, gen.signature, 1, 96)
    cache = PrefixCache(3 * BLOCK * loop.token_bytes, BLOCK, loop.token_bytes)  # room for 3 blocks
    a = RNG.integers(1, 256, size=2 * BLOCK).tolist()
    b = RNG.integers(1, 256, size=2 * BLOCK).tolist()
    for prompt in (a, b):
        loop.prefill(0, prompt)
        cache.store(loop, 0, prompt)
        loop.release(0)
    # b's second block did not fit until a's leaf went: leaves go first, so a's first block is still a prefix.
    stats = cache.stats()
    assert stats["evictions"] == 1 and stats["blocks"] == 3 and stats["bytes_held"] <= stats["capacity_bytes"]
    assert cache.lookup(a + [1, 2]).tokens == BLOCK  # a's root block survived, its leaf did not
    assert cache.lookup(b + [1, 2]).tokens == 2 * BLOCK


def test_a_pinned_block_is_not_evicted_and_a_full_cache_stores_nothing(gen: Generator) -> None:
    loop = BatchedLoop(gen.vsession.session, gen.signature, 1, 96)
    cache = PrefixCache(BLOCK * loop.token_bytes, BLOCK, loop.token_bytes)  # exactly one block
    a = RNG.integers(1, 256, size=BLOCK + 2).tolist()
    loop.prefill(0, a)
    cache.store(loop, 0, a)
    match = cache.lookup(a)
    assert match.tokens == BLOCK and cache.pinned == 1
    b = RNG.integers(1, 256, size=BLOCK).tolist()
    loop.release(0)
    loop.prefill(0, b)
    assert cache.store(loop, 0, b) == 0 and cache.stats()["evictions"] == 0
    cache.release(match)
    assert cache.store(loop, 0, b) == 1 and cache.stats()["evictions"] == 1


def test_a_cancelled_request_frees_its_slot_and_its_pins(gen: Generator) -> None:
    scheduler = Scheduler(gen, max_streams=1, max_length=96, prefill_chunk=4, options=_options(1 << 20))
    first = scheduler.submit(PROMPTS[0], 2)
    scheduler.run_until_idle()
    stream = scheduler.submit(PROMPTS[5], 8)  # 65 tokens: 40 from the cache, 25 prefilled 4 at a time
    scheduler.step()
    assert stream.match is not None and stream.match.tokens == 40 and scheduler.cache.pinned == 5
    assert stream.prefilled == 44 and not stream.tokens  # still prefilling
    stream.cancel()
    scheduler.step()
    assert stream.stop_reason == "cancelled" and scheduler.loop.lengths[0] == 0
    assert scheduler.cache.pinned == 0 and stream.match is None and first.stop_reason == "max_new_tokens"


def test_a_cap_below_one_block_is_refused_naming_the_setting(gen: Generator) -> None:
    with pytest.raises(UsageError, match=r"prefix_cache_bytes 100 is below one block .* prefix_block 8 tokens"):
        Scheduler(gen, max_streams=1, max_length=64, options=_options(100))
    off = Scheduler(gen, max_streams=1, max_length=64, options=_options(0))
    assert off.cache is None and off.counters()["prefix_cache"] is None
