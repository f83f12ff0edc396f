"""``measure.bench.bench``: real ORT sessions on the demo models; structure and invariants, no timings."""

from __future__ import annotations

import json

import numpy as np
import pytest
from bench_models import failing_call, flaky_model

from ortpilot.errors import InputError, UsageError
from ortpilot.measure.bench import BenchmarkRunError, bench
from ortpilot.session import SessionSettings, load

STAT_KEYS = (
    "count",
    "min_ms",
    "mean_ms",
    "p50_ms",
    "p90_ms",
    "p95_ms",
    "p99_ms",
    "p999_ms",
    "max_ms",
    "std_ms",
    "median_ci95_ms",
    "inferences_per_s",
    "items_per_s",
    "noisy",
    "noise_reasons",
)


def test_fixed_runs_report_every_statistic(demo_paths) -> None:
    result = bench(str(demo_paths["mlp"]), runs=40, warmup=3)
    doc = json.loads(json.dumps(result.to_dict()))
    assert doc["runs"] == 40 and len(doc["samples_ms"]) == 40 and len(doc["offsets_s"]) == 40
    warm = doc["warmup"]
    assert (warm["mode"], warm["runs"], warm["settled"]) == ("count", 3, None) and warm["median_ms"] > 0
    for key in STAT_KEYS:
        assert key in doc["latency"], key
    lat = doc["latency"]
    assert lat["count"] == 40
    assert lat["min_ms"] <= lat["p50_ms"] <= lat["p99_ms"] <= lat["max_ms"]
    assert doc["session_create_ms"] > 0 and doc["first_run_ms"] > 0
    assert doc["offsets_s"] == sorted(doc["offsets_s"])
    mem = doc["memory"]
    assert mem["peak_mb"] >= mem["after_load_mb"] > 0 and mem["growth_mb"] is not None
    assert doc["inputs"] == "generated" and doc["shapes"] == {"x": [1, 64]}
    assert doc["environment"]["onnxruntime"] and doc["failure"] is None and doc["roofline"] is None


def test_auto_warmup_settles_or_says_so(demo_paths) -> None:
    result = bench(str(demo_paths["mlp"]), runs=10)
    assert result.warmup.mode == "auto" and result.warmup.runs >= 3
    assert result.warmup.settled in (True, False)


def test_duration_mode_runs_at_least_the_minimum(demo_paths) -> None:
    result = bench(str(demo_paths["mlp"]), duration_s=0.05, warmup=0)
    assert len(result.samples_s) >= 10


def test_batch_shapes_scale_items_per_second(demo_paths) -> None:
    result = bench(str(demo_paths["mlp"]), shapes={"x": (4, 64)}, runs=20, warmup=1)
    assert result.batch_size == 4
    assert result.stats.items_per_s == pytest.approx(4 * result.stats.inferences_per_s)


def test_iobinding_and_concurrency_count_every_run(demo_paths) -> None:
    result = bench(str(demo_paths["encoder"]), runs=30, warmup=2, iobinding=True, concurrency=3)
    assert result.iobinding and result.concurrency == 3
    assert len(result.samples_s) == 30 and result.stats.count == 30
    assert result.stats.inferences_per_s > 0


def test_given_feeds_and_a_loaded_session(demo_paths) -> None:
    sess = load(str(demo_paths["mlp"]), settings=SessionSettings(intra_op_threads=1))
    feeds = {"x": np.ones((2, 64), np.float32)}
    result = bench(sess, feeds=feeds, runs=5, warmup=0)
    assert result.inputs == "given" and result.session_create_s is None
    assert result.settings["intra_op_threads"] == 1 and result.shapes == {"x": [2, 64]}


@pytest.mark.parametrize(
    "kwargs",
    [
        {"runs": 0},
        {"runs": -5},
        {"duration_s": 0},
        {"runs": 5, "duration_s": 1.0},
        {"concurrency": 257},
        {"concurrency": 0},
        {"warmup": -1},
    ],
)
def test_bad_budgets_are_usage_errors(demo_paths, kwargs) -> None:
    with pytest.raises(UsageError):
        bench(str(demo_paths["mlp"]), **kwargs)


def test_shapes_contradicting_the_model(demo_paths) -> None:
    with pytest.raises(InputError, match="rank"):
        bench(str(demo_paths["cnn"]), shapes={"image": (1, 3)}, runs=1)


def test_failure_mid_benchmark_reports_the_run_and_partial_stats() -> None:
    model = flaky_model()
    call = failing_call(model)  # call 0 is the first run, then 2 warm-up runs, then timed runs
    assert call > 10, "pick another seed: the model must fail among the timed runs"
    with pytest.raises(BenchmarkRunError) as info:
        bench(model, runs=call + 50, warmup=2)
    err = info.value
    assert err.exit_code == 1
    assert err.phase == "runs" and err.run_index == call - 3
    assert f"run {call - 3}" in str(err)
    partial = err.partial.to_dict()
    assert partial["runs"] == call - 3 and partial["latency"]["count"] == call - 3
    assert partial["failure"]["run_index"] == call - 3 and "out of data bounds" in partial["failure"]["message"]
