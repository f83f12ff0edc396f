"""Several weight formats on one KV buffer: the measured plan, the gate, refusals, what runs where."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest

from ortpilot.decode import BatchedLoop, Generator, Scheduler
from ortpilot.decode.formats import FormatPlan, prefill_points, row_points
from ortpilot.decode.options import EngineOptions
from ortpilot.errors import AccuracyGateError, UsageError
from ortpilot.passes.decoder_fusion import fuse_decoder

RNG = np.random.default_rng(21)
PROMPTS = [RNG.integers(1, 256, size=n).tolist() for n in (5, 19, 2, 11)]
NEW = 8
INT8 = "int8-weights"


@pytest.fixture(scope="module")
def gen(fused_decoder: onnx.ModelProto) -> Generator:
    return Generator(fused_decoder)


@pytest.fixture(scope="module")
def reference(gen: Generator) -> list[list[int]]:
    return [gen.generate(p, NEW, speculation="off").tokens[0] for p in PROMPTS]


def _options(*formats: str, **kw) -> EngineOptions:
    return EngineOptions(formats=formats, speculation="off", measure_rounds=1, **kw)


def test_plan_picks_the_next_measured_count_and_round_trips() -> None:
    plan = FormatPlan(((1, "int4"), (2, "int4"), (4, "base")), ((8, "int4"), (64, "base")))
    assert [plan.for_step(r) for r in (1, 2, 3, 4, 9)] == ["int4", "int4", "base", "base", "base"]
    assert [plan.for_prefill(t) for t in (2, 8, 9, 500)] == ["int4", "int4", "base", "base"]
    assert FormatPlan.from_dict(plan.to_dict()) == plan and plan.formats == {"int4", "base"}
    assert row_points(8) == [1, 2, 3, 4, 6, 8] and row_points(5) == [1, 2, 3, 4, 5]
    assert prefill_points(64) == [2, 4, 8, 16, 32] and prefill_points(1024)[-1] == 128


def test_two_formats_are_measured_gated_and_counted(gen: Generator) -> None:
    scheduler = Scheduler(gen, max_streams=3, max_length=64, options=_options("base", INT8))
    plan = scheduler.formats.plan
    assert [r for r, _ in plan.decode] == row_points(3) and [t for t, _ in plan.prefill] == prefill_points(64)
    for kind in ("decode", "prefill"):
        assert set(plan.timings_ms[kind]) == {"base", INT8}
        assert all(ms > 0 for per in plan.timings_ms[kind].values() for ms in per.values())
    assert scheduler.formats.gate[INT8]["passed"] and scheduler.formats.gate[INT8]["top1_agreement"] >= 0.9
    assert int(scheduler.loop.lengths.sum()) == 0  # the measurement leaves the slots empty
    assert scheduler.formats.generators["base"] is gen  # the base session itself, not a second copy
    assert scheduler.formats.generators[INT8].vsession.settings == gen.vsession.settings
    streams = [scheduler.submit(p, NEW) for p in PROMPTS]
    scheduler.run_until_idle()
    assert all(len(s.tokens) == NEW for s in streams)
    per = scheduler.counters()["formats"]["per_format"]
    assert sum(f["decode_steps"] for f in per.values()) == scheduler.steps
    assert sum(f["prefill_tokens"] for f in per.values()) == sum(map(len, PROMPTS))


def test_one_format_running_every_step_keeps_single_stream_tokens(gen: Generator, reference: list[list[int]]) -> None:
    plan = FormatPlan.single("base")  # both formats loaded and bound to the buffer, base runs everything
    scheduler = Scheduler(gen, max_streams=2, max_length=64, options=_options(INT8, "base"), format_plan=plan)
    assert scheduler.loop is scheduler.formats.loops[INT8]  # the buffer belongs to the first format's loop
    streams = [scheduler.submit(p, NEW) for p in PROMPTS]
    scheduler.run_until_idle()
    assert [s.tokens for s in streams] == reference
    assert scheduler.counters()["formats"]["per_format"][INT8]["decode_steps"] == 0


def test_a_step_on_another_format_reads_the_rows_prefill_wrote(gen: Generator) -> None:
    scheduler = Scheduler(
        gen,
        max_streams=1,
        max_length=64,
        options=_options("base", INT8),
        format_plan=FormatPlan(((1, INT8),), ((1, "base"),)),
    )
    base, int8 = scheduler.formats.loops["base"], scheduler.formats.loops[INT8]
    first = int(base.prefill(0, PROMPTS[1]).argmax())
    mixed = int8.step({0: first})[0].copy()
    alone = BatchedLoop(gen.vsession.session, gen.signature, 1, 64)
    alone.prefill(0, PROMPTS[1])
    plain = alone.step({0: first})[0]
    assert np.allclose(mixed, plain, atol=0.2) and not np.array_equal(mixed, plain)  # int8 weights, base's rows
    own = BatchedLoop(int8.session, int8.sig, 1, 64)  # int8 weights on a buffer of its own: zero rows
    own.lengths[0] = len(PROMPTS[1])
    empty = own.step({0: first})[0]
    assert np.abs(empty - plain).max() > 10 * np.abs(mixed - plain).max()


def test_a_format_that_fails_the_gate_is_refused(gen: Generator) -> None:
    with pytest.raises(AccuracyGateError, match=r"'int4' fails the generation gate .* format_min_top1 \(now 0.95\)"):
        Scheduler(gen, max_streams=1, max_length=64, options=_options("base", "int4", format_min_top1=0.95))


def test_formats_that_cannot_share_a_buffer_are_refused(gen: Generator, tmp_path: Path) -> None:
    from ortpilot.models import make_decoder

    for name, model, message in (
        ("vocab", make_decoder(vocab=300), "has a vocabulary of 300 tokens and 'base' one of 256"),
        ("kv", make_decoder(kv_heads=1, heads=4), "disagree on the KV cache layout"),
    ):
        path = tmp_path / f"{name}.onnx"
        onnx.save(fuse_decoder(model).model, str(path))
        with pytest.raises(UsageError, match=message):
            Scheduler(gen, max_streams=1, max_length=64, options=_options("base", f"{name}={path}"))
    with pytest.raises(UsageError, match="unknown weight format 'int3'"):
        Scheduler(gen, max_streams=1, max_length=64, options=_options("base", "int3"))
    with pytest.raises(UsageError, match="which does not exist"):
        Scheduler(gen, max_streams=1, max_length=64, options=_options("base", f"x={tmp_path / 'no.onnx'}"))
    with pytest.raises(UsageError, match="The format plan names int4"):
        Scheduler(gen, max_streams=1, max_length=64, options=_options("base"), format_plan=FormatPlan.single("int4"))
