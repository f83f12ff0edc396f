"""``bench_interleaved``: alternating turns in one process, ratios against the baseline."""

from __future__ import annotations

import os

import pytest
from bench_models import failing_call, flaky_model

from ortpilot.errors import UsageError
from ortpilot.measure.bench import BenchmarkRunError
from ortpilot.measure.interleave import BenchConfig, bench_interleaved
from ortpilot.measure.placement import pinned_cpus
from ortpilot.session import SessionSettings


def test_configs_alternate_and_get_equal_runs(demo_paths) -> None:
    model = str(demo_paths["mlp"])
    configs = [
        BenchConfig(model=model),
        BenchConfig("one", model, settings=SessionSettings(intra_op_threads=1)),
        BenchConfig("io", model, iobinding=True),
    ]
    result = bench_interleaved(configs, runs=25, warmup=2, block=4)
    assert [r.name for r in result.results] == ["A", "one", "io"]
    assert result.block == 4 and result.rounds == 7  # ceil(25 / 4)
    for res in result.results:
        assert len(res.samples_s) == 25 and sorted(set(res.rounds)) == list(range(7))
    # One time axis; turn order alternates: A before "io" in even rounds, after it in odd rounds.
    a, io = result.results[0], result.results[2]

    def start(res, rnd):
        return min(o for o, r in zip(res.offsets_s, res.rounds) if r == rnd)

    assert all((start(a, r) < start(io, r)) == (r % 2 == 0) for r in range(7))
    doc = result.to_dict(samples=False)
    assert doc["kind"] == "comparison" and doc["baseline"] == "A" and len(doc["ratios"]) == 2
    for ratio in doc["ratios"]:
        assert ratio["ci95"][0] <= ratio["ratio"] <= ratio["ci95"][1]
        assert ratio["pooled_ci95"][0] <= ratio["pooled_ratio"] <= ratio["pooled_ci95"][1]
        assert ratio["verdict"] in ("faster", "slower", "same within noise")


def test_duration_mode_and_auto_block(demo_paths) -> None:
    model = str(demo_paths["mlp"])
    result = bench_interleaved([BenchConfig(model=model), BenchConfig(model=model)], duration_s=0.2, warmup=2)
    assert result.block >= 1 and result.rounds >= 1
    assert all(len(r.samples_s) >= 10 for r in result.results)


def test_names_must_be_unique(demo_paths) -> None:
    model = str(demo_paths["mlp"])
    with pytest.raises(UsageError, match="unique"):
        bench_interleaved([BenchConfig("x", model), BenchConfig("x", model)], runs=2)


def test_a_failing_config_names_itself_and_keeps_the_rest(demo_paths) -> None:
    flaky = flaky_model()
    call = failing_call(flaky)
    configs = [BenchConfig(model=str(demo_paths["mlp"])), BenchConfig("flaky", flaky)]
    with pytest.raises(BenchmarkRunError, match="'flaky'") as info:
        bench_interleaved(configs, runs=call + 20, warmup=0, block=5)
    partial = info.value.partial
    assert partial.failure["config"] == "flaky" and partial.failure["run_index"] == call - 1
    assert len(partial.results[1].samples_s) == call - 1
    assert len(partial.results[0].samples_s) >= call - 1 - 5  # at most one turn behind


@pytest.mark.slow
def test_same_config_twice_has_a_ratio_ci_containing_one(demo_paths) -> None:
    model = str(demo_paths["encoder"])
    result = bench_interleaved([BenchConfig(model=model), BenchConfig(model=model)], runs=1000, warmup="auto")
    ratio = result.ratios[0]
    assert ratio.ci_low <= 1.0 <= ratio.ci_high  # the verdict's paired ratio (the done-when)


def test_settled_turns_start_after_untimed_runs_and_keep_the_run_counts(demo_paths) -> None:
    """settle_s: each turn starts with untimed runs for that long (the tune's final does the same, so verify
    --bench times as the tune did); the timed runs are as many as asked, and the time axis shows the gaps."""
    model = str(demo_paths["mlp"])
    configs = [BenchConfig(model=model), BenchConfig("B", model)]
    plain = bench_interleaved(configs, runs=20, warmup=2, block=5)
    settled = bench_interleaved(configs, runs=20, warmup=2, block=5, settle_s=0.05)
    assert all(len(r.samples_s) == 20 for r in settled.results) and settled.rounds == plain.rounds == 4
    first_b = [
        min(o for o, r in zip(settled.results[1].offsets_s, settled.results[1].rounds) if r == k) for k in (0, 2)
    ]
    last_a = [max(o for o, r in zip(settled.results[0].offsets_s, settled.results[0].rounds) if r == k) for k in (0, 2)]
    # in even rounds A's turn comes first: B's first timed run waits out B's settling after A's last run
    assert all(b - a >= 0.05 for a, b in zip(last_a, first_b)), (last_a, first_b)
    span = max(settled.results[0].offsets_s + settled.results[1].offsets_s)
    assert span >= 7 * 0.05  # 8 turns, each settled (the first one's settling precedes the axis' origin or not)


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="one CPU: ORT's default pins no pool thread")
def test_turns_hold_the_caller_away_from_the_cpus_ort_default_pinned(demo_paths) -> None:
    # ORT's default session pins a pool thread per core beyond the first; beside one the demo encoder's default
    # ran 1.6x slower, so the turns run the calling thread on the CPUs no pinned thread holds
    model = str(demo_paths["mlp"])
    configs = [BenchConfig(model=model), BenchConfig("explicit", model, settings=SessionSettings(intra_op_threads=2))]
    before = os.sched_getaffinity(0)
    during: list[set[int]] = []
    result = bench_interleaved(
        configs, runs=40, warmup=2, block=4, progress=lambda *_: during.append(os.sched_getaffinity(0))
    )
    away = set(result.environment["caller_cpus"])
    assert away and away < before and not away & pinned_cpus(), (away, pinned_cpus())
    assert during and all(cpus == away for cpus in during), during
    assert os.sched_getaffinity(0) == before  # restored after the turns
    assert result.to_dict(samples=False)["environment"]["caller_cpus"] == sorted(away)
