"""Prompt-lookup speculation: drafts, acceptance at near ties, identity with plain decoding, auto off."""

from __future__ import annotations

import numpy as np
import onnx
import pytest

from ortpilot.decode import Generator, Scheduler
from ortpilot.decode.options import EngineOptions
from ortpilot.decode.speculative import PROBE_RUNS, Speculator, StreamSpeculation, accept, calibrate, find_draft
from ortpilot.errors import UsageError
from ortpilot.passes.decoder_fusion import fuse_decoder


@pytest.fixture(scope="module")
def gen(fused_decoder: onnx.ModelProto) -> Generator:
    return Generator(fused_decoder)


@pytest.fixture(scope="module")
def grounded(gen: Generator) -> list[list[int]]:
    """Prompts that end where an earlier passage began, so the model's answer copies what followed it."""
    out = []
    for seed in range(6):
        head = np.random.default_rng(seed).integers(1, 256, size=12).tolist()
        out.append(head + gen.generate(head, 24, speculation="off").tokens[0] + head)
    return out


def test_find_draft_takes_the_latest_longest_match() -> None:
    assert find_draft([1, 2, 3, 9, 9, 1, 2, 3], 3) == [9, 9, 1]  # 3-gram 1 2 3 seen at the start
    assert find_draft([5, 1, 2, 7, 1, 2, 8, 1, 2], 2) == [8, 1]  # the latest earlier occurrence
    assert find_draft([1, 2, 3, 4], 4) == [] and find_draft([7], 2) == []
    assert find_draft([4, 4, 4, 4], 5) == [4]  # an overlapping match drafts what follows it


def test_accept_keeps_the_agreed_prefix_the_model_token_and_stops_at_a_near_tie() -> None:
    def logits(*winners: int, lead: float = 1.0) -> np.ndarray:
        rows = np.zeros((len(winners), 10), dtype=np.float32)
        for i, w in enumerate(winners):
            rows[i, w] = lead
        return rows

    assert accept(logits(4, 5, 6), [4, 5], 1e-3) == [4, 5, 6]  # all drafted tokens and the bonus one
    assert accept(logits(4, 9, 6), [4, 5], 1e-3) == [4, 9]  # the model's own token where it disagrees
    assert accept(logits(3, 5, 6), [4, 5], 1e-3) == [3]
    tie = logits(4, 5, 6)
    tie[1, 2] = 1.0 - 1e-4  # row 1's top-1 leads by less than the margin
    assert accept(tie, [4, 5], 1e-3) == [4]


def test_generate_with_speculation_equals_plain_decoding(gen: Generator, grounded: list[list[int]]) -> None:
    accepted = 0
    for prompt in grounded:
        plain = gen.generate(prompt, 30, speculation="off")
        spec = gen.generate(prompt, 30, speculation="on")
        assert spec.tokens == plain.tokens and plain.speculation == {}
        assert spec.loop == "shared" and spec.kv_host_bytes_per_token == 0 and len(spec.step_ms) == 29
        accepted += spec.speculation["accepted"]
        assert spec.speculation["emitted"] <= 29
    assert accepted > 10  # the verify path really ran and kept drafted tokens
    assert 0 <= spec.speculation["tie_margin"] < 1e-3 and spec.speculation["withheld"] is None


def test_calibrated_distance_is_small_on_fp32_and_stays_off_the_request_slots(gen: Generator) -> None:
    distance = calibrate(gen.vsession.session, gen.signature, 4)
    assert 0.0 <= distance < 1e-4  # the demo decoder in fp32: MLAS's one-row SGEMM, 1e-6 scale


def test_a_stream_decoding_alone_speculates_in_the_scheduler(gen: Generator, grounded: list[list[int]]) -> None:
    reference = [gen.generate(p, 30, speculation="off").tokens[0] for p in grounded]
    scheduler = Scheduler(gen, max_streams=2, max_length=128, options=EngineOptions(speculation="on"))
    streams = []
    for prompt in grounded:  # one at a time, so every decode is a batch-1 step
        streams.append(scheduler.submit(prompt, 30))
        scheduler.run_until_idle()
    assert [s.tokens for s in streams] == reference
    spec = scheduler.counters()["speculation"]
    assert spec["verify_runs"] > 0 and spec["accepted"] > 10 and spec["emitted"] >= spec["accepted"]
    together = [scheduler.submit(p, 30) for p in grounded[:2]]  # two at once: plain batched steps
    before = spec["verify_runs"]
    scheduler.run_until_idle()
    assert [s.tokens for s in together] == reference[:2]
    assert scheduler.counters()["speculation"]["verify_runs"] - before <= 10  # only once one stream is left


def test_a_stream_cancelled_mid_burst_gets_no_more_tokens(gen: Generator, grounded: list[list[int]]) -> None:
    scheduler = Scheduler(gen, max_streams=1, max_length=128, options=EngineOptions(speculation="on"))
    seen: list[int] = []

    def on_token(stream, token) -> None:
        if token is not None:
            seen.append(token)
            if len(seen) == 8:
                stream.cancel()

    stream = scheduler.submit(grounded[5], 30, on_token=on_token)
    scheduler.run_until_idle()
    assert stream.stop_reason == "cancelled" and stream.tokens_after_cancel == 0 and len(stream.tokens) == 8
    assert scheduler.loop.lengths[0] == 0


def test_auto_pauses_a_stream_whose_drafts_do_not_pay() -> None:
    spec = Speculator("auto", 4)
    state = StreamSpeculation()
    assert spec.draft(state, [1, 2, 3, 1, 2], 0, 4, 1) == []  # no plain step measured yet to compare with
    spec.record_step(1, 0.010)
    assert spec.draft(state, [1, 2, 3, 1, 2], 0, 4, 1) == [3, 1, 2]
    for produced in range(PROBE_RUNS):  # each run costs two steps and makes one token: it does not pay
        spec.record_verify(state, 5, 4, [7], [3, 1, 2, 9], 0.020, produced, 1)
    assert state.paused_until > PROBE_RUNS and spec.counters.paused == 1
    assert spec.draft(state, [1, 2, 3, 1, 2], PROBE_RUNS, 4, 1) == []
    good = StreamSpeculation()
    for produced in range(PROBE_RUNS):  # three tokens per run at 1.5 steps' cost: it pays
        spec.record_verify(good, 5, 4, [3, 1, 2], [3, 1, 9, 9], 0.015, produced, 1)
    assert good.paused_until == 0 and spec.cost_ratio(5) == pytest.approx(1.5, rel=0.5)


def test_auto_withholds_speculation_where_verify_runs_round_like_another_format() -> None:
    auto, on = Speculator("auto", 4), Speculator("on", 4)
    for spec in (auto, on):
        spec.measured(0.5)  # SmolLM2 int4 on AVX2 measured about 1
        spec.record_step(1, 0.01)
    assert not auto.enabled and "would change later tokens" in auto.withheld
    assert auto.draft(StreamSpeculation(), [1, 2, 3, 1, 2], 1, 4, 1) == []
    assert on.enabled and on.margin == pytest.approx(2.0) and on.draft(StreamSpeculation(), [1, 2, 3, 1, 2], 1, 4, 1)
    fine = Speculator("auto", 4)
    fine.measured(4e-5)  # SmolLM2 fp32
    assert fine.enabled and fine.to_dict()["distance"] == 4e-5


def test_speculation_lengths_that_cannot_run_are_refused(gen: Generator) -> None:
    with pytest.raises(UsageError, match=r"draft_tokens \(the speculation length\) must be at least 1"):
        gen.generate([1, 2], 4, draft_tokens=0)
    with pytest.raises(UsageError, match="does not fit a stream's max_length of 8 tokens"):
        Scheduler(gen, max_streams=1, max_length=8, options=EngineOptions(draft_tokens=7))
    from ortpilot.models import make_decoder

    short = Generator(fuse_decoder(make_decoder(), max_positions=12).model)
    with pytest.raises(UsageError, match="does not fit the model's positions of 12 tokens"):
        short.generate([1, 2], 4, draft_tokens=11)
    assert len(short.generate([1, 2], 4, draft_tokens=10, speculation="off").tokens[0]) == 4
