"""Continuous batching: every stream gets exactly its single-stream tokens, slots come and go."""

from __future__ import annotations

import threading

import numpy as np
import onnx
import pytest

from ortpilot.decode import BatchedLoop, Generator, SamplingConfig, Scheduler
from ortpilot.decode.batched import chunk_length
from ortpilot.errors import QueueFullError, UsageError

LENGTHS = [1, 5, 17, 2, 33, 9, 64, 3, 12, 7]
NEW = [20, 7, 30, 15, 11, 25, 9, 40, 5, 18]
# Request index -> the step() call before which it arrives: pairs, a burst, gaps, one late.
ARRIVALS = {0: [0, 1], 3: [2], 4: [3, 4, 5], 10: [6], 11: [7, 8], 30: [9]}


def _prompt(length: int, seed: int) -> list[int]:
    return np.random.default_rng(seed).integers(1, 256, size=length).tolist()


PROMPTS = [_prompt(n, seed=i) for i, n in enumerate(LENGTHS)]


@pytest.fixture(scope="module")
def fused_gen(fused_decoder: onnx.ModelProto) -> Generator:
    return Generator(fused_decoder)


@pytest.fixture(scope="module")
def reference(fused_gen: Generator) -> list[list[int]]:
    """Single-stream greedy tokens, one request at a time, through the shared-buffer loop."""
    out = []
    for prompt, new in zip(PROMPTS, NEW):
        result = fused_gen.generate(prompt, new)
        assert result.loop == "shared"
        out.append(result.tokens[0])
    return out


def _run_staggered(scheduler: Scheduler) -> list:
    streams, step = [], 0
    while True:
        for index in ARRIVALS.get(step, []):
            streams.append(scheduler.submit(PROMPTS[index], NEW[index]))
        more = scheduler.step()
        step += 1
        if not more and step > max(ARRIVALS):
            return streams


@pytest.mark.parametrize("prefill_chunk", [0, 4, 1])
def test_staggered_streams_equal_single_stream(
    fused_gen: Generator, reference: list[list[int]], prefill_chunk: int
) -> None:
    scheduler = Scheduler(fused_gen, max_streams=4, max_queue=16, max_length=128, prefill_chunk=prefill_chunk)
    streams = _run_staggered(scheduler)
    assert [s.tokens for s in streams] == reference
    assert all(s.stop_reason == "max_new_tokens" for s in streams)
    # It really batched (more than one row per step) and reused slots (10 requests, 4 slots).
    stats = scheduler.stats()
    assert stats["mean_rows_per_step"] > 1.5 and stats["pending"] == 0
    assert len({s.slot for s in streams}) == 4
    # The requests are not all the same: different prompts, different continuations.
    assert len({tuple(t) for t in reference}) == len(reference)


def test_batched_logits_are_bit_identical(fused_decoder: onnx.ModelProto, fused_gen: Generator) -> None:
    """Rows decoded together give the very logits of the same sequences decoded alone."""
    session, sig = fused_gen.vsession.session, fused_gen.signature
    prompts = PROMPTS[:4]
    alone = []
    for prompt in prompts:
        loop = BatchedLoop(session, sig, 1, 96)
        logits = [loop.prefill(0, prompt).copy()]
        for _ in range(6):
            logits.append(loop.step({0: int(logits[-1].argmax())})[0].copy())
        alone.append(logits)
    loop = BatchedLoop(session, sig, 4, 96)
    together = [[loop.prefill(slot, prompt).copy()] for slot, prompt in enumerate(prompts)]
    for _ in range(6):
        rows = loop.step({slot: int(t[-1].argmax()) for slot, t in enumerate(together)})
        for slot, t in enumerate(together):
            t.append(rows[slot].copy())
    for a, b in zip(alone, together):
        assert all(np.array_equal(x, y) for x, y in zip(a, b))
    assert loop.kv_cache_bytes == sum(int(np.prod(c.shape(4, 96))) * 4 for c in sig.cache)


def test_finished_and_cancelled_streams_free_their_slot_at_once(
    fused_gen: Generator, reference: list[list[int]]
) -> None:
    scheduler = Scheduler(fused_gen, max_streams=2, max_queue=4, max_length=128)
    stop = reference[0][3]
    first = reference[0].index(stop)
    a = scheduler.submit(PROMPTS[0], NEW[0], stop_tokens=[stop])
    b = scheduler.submit(PROMPTS[2], NEW[2])
    c = scheduler.submit(PROMPTS[5], NEW[5])  # queued: both slots busy
    steps = 0
    while not a.done:
        scheduler.step()
        steps += 1
    # The stop token ends a with it (as generate does), in the step that made it, and frees slot 0.
    assert a.tokens == reference[0][: first + 1] and a.stop_reason == "stop_token" and steps == first
    assert scheduler.loop.lengths[a.slot] == 0 and c.slot is None
    scheduler.step()
    assert c.slot == a.slot and len(c.tokens) == 2  # admitted, prefilled and decoded in the very next step
    b.cancel()
    scheduler.step()  # a client gone: its slot is free before this step decodes
    assert b.stop_reason == "cancelled" and scheduler.loop.lengths[b.slot] == 0
    assert b.tokens == reference[2][: len(b.tokens)] and len(b.tokens) < NEW[2]
    scheduler.run_until_idle()
    assert c.tokens == reference[5]


def test_a_request_still_queued_at_its_deadline_is_never_admitted(
    fused_gen: Generator, reference: list[list[int]]
) -> None:
    import time

    scheduler = Scheduler(fused_gen, max_streams=1, max_queue=4, max_length=128)
    busy = scheduler.submit(PROMPTS[0], NEW[0])
    late = scheduler.submit(PROMPTS[2], NEW[2], deadline=time.monotonic() - 1)  # passed while it waits
    timely = scheduler.submit(PROMPTS[5], NEW[5], deadline=time.monotonic() + 3600)
    scheduler.step()
    assert late.done and late.stop_reason == "deadline" and late.tokens == [] and late.slot is None
    assert late.admitted_at is None and busy.slot == 0 and timely.slot is None
    scheduler.run_until_idle()
    assert busy.tokens == reference[0] and timely.tokens == reference[5]  # the others as if it never came
    assert scheduler.counters()["finished"]["deadline"] == 1


def test_each_request_samples_with_its_own_settings(fused_gen: Generator, reference: list[list[int]]) -> None:
    sampling = SamplingConfig(temperature=0.8, top_p=0.9, seed=7)
    alone = fused_gen.generate(PROMPTS[4], 16, sampling=sampling).tokens[0]
    scheduler = Scheduler(fused_gen, max_streams=3, max_length=128)
    greedy = scheduler.submit(PROMPTS[1], NEW[1])
    sampled = scheduler.submit(PROMPTS[4], 16, sampling=sampling)
    other_seed = scheduler.submit(PROMPTS[4], 16, sampling=SamplingConfig(temperature=0.8, top_p=0.9, seed=8))
    scheduler.run_until_idle()
    assert sampled.tokens == alone and greedy.tokens == reference[1]
    assert other_seed.tokens != alone and sampled.tokens != reference[4][:16]


def test_engine_thread_serves_concurrent_submitters(fused_gen: Generator, reference: list[list[int]]) -> None:
    results: dict[int, list[int]] = {}
    with Scheduler(fused_gen, max_streams=3, max_queue=8, max_length=128) as scheduler:

        def client(index: int) -> None:
            results[index] = list(scheduler.submit(PROMPTS[index], NEW[index]))

        threads = [threading.Thread(target=client, args=(i,)) for i in range(6)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=60)
    assert results == {i: reference[i] for i in range(6)}


def test_metrics_per_request(fused_gen: Generator) -> None:
    scheduler = Scheduler(fused_gen, max_streams=1, max_length=128)
    a = scheduler.submit(PROMPTS[2], 6)
    b = scheduler.submit(PROMPTS[3], 4)  # waits for a's slot
    scheduler.run_until_idle()
    ma, mb = a.wait(0), b.wait(0)
    assert (ma.prompt_tokens, ma.completion_tokens, mb.completion_tokens) == (17, 6, 4)
    assert 0 < ma.ttft_s < ma.total_s and ma.ms_per_token > 0 and ma.decode_s > 0
    assert mb.queue_s >= ma.total_s - ma.queue_s > 0  # b waited while a ran
    assert ma.to_dict()["stop_reason"] == "max_new_tokens"


def test_queue_limit_refuses_with_retry_after(fused_gen: Generator) -> None:
    scheduler = Scheduler(fused_gen, max_streams=1, max_queue=1, max_length=64)
    scheduler.submit(PROMPTS[1], 4)  # takes the free slot
    scheduler.submit(PROMPTS[1], 4)  # waits in the queue
    with pytest.raises(QueueFullError) as err:
        scheduler.submit(PROMPTS[1], 4)
    assert err.value.retry_after_s >= 1 and "queued (the limit is 1)" in str(err.value)
    scheduler.run_until_idle()
    scheduler.submit(PROMPTS[1], 4)  # room again


def test_requests_that_cannot_fit_are_refused(fused_gen: Generator, demo_decoder: onnx.ModelProto) -> None:
    scheduler = Scheduler(fused_gen, max_streams=2, max_length=32)
    with pytest.raises(UsageError, match="The prompt has 33 tokens, but a stream holds 32"):
        scheduler.submit(PROMPTS[4], 1)
    with pytest.raises(UsageError, match=r"between 1 and 15 .* prompt has 17"):
        scheduler.submit(PROMPTS[2], 16)
    with pytest.raises(UsageError, match="between 1 and"):
        scheduler.submit(PROMPTS[2], 0)
    with pytest.raises(UsageError, match="outside the vocabulary"):
        scheduler.submit([1, 256], 4)
    with pytest.raises(UsageError, match="above the model's 2048 positions"):
        Scheduler(fused_gen, max_length=4096)
    with pytest.raises(UsageError, match="Fuse the model first"):
        Scheduler(demo_decoder)
    # a KV buffer no machine holds (the demo's 4.9 TB) is refused naming what sizes it, before numpy tries
    with pytest.raises(UsageError, match=r"KV buffer of 10,000,000 stream\(s\) x 1,024 tokens .*\(--max-streams\)"):
        Scheduler(fused_gen, max_streams=10_000_000, max_length=1024)


def test_chunk_plan_never_leaves_a_lone_token() -> None:
    for remaining in range(1, 40):
        for budget in range(12):
            done, chunks = 0, []
            while done < remaining:
                take = chunk_length(remaining - done, budget)
                chunks.append(take)
                done += take
            assert done == remaining
            assert remaining == 1 or 1 not in chunks, (remaining, budget, chunks)
            assert budget == 0 or max(chunks) <= max(budget, 2) + 1
