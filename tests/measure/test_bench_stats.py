"""Statistics: order of percentiles, seeded bootstrap intervals, ratios, the noise flag."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ortpilot.measure.stats import (
    bootstrap_median_ci,
    bootstrap_ratio_ci,
    paired_ratio_ci,
    summarize,
)

samples = st.lists(st.floats(min_value=1e-6, max_value=10.0, allow_nan=False), min_size=1, max_size=300)


@settings(max_examples=40, deadline=None)
@given(samples)
def test_percentiles_are_ordered_and_inside_the_range(xs: list[float]) -> None:
    s = summarize(xs, n_boot=200)
    chain = [s.min, s.p10, s.p50, s.p90, s.p95, s.p99, s.p999, s.max]
    assert all(a <= b + 1e-15 for a, b in zip(chain, chain[1:]))
    assert s.min - 1e-15 <= s.median_ci[0] <= s.median_ci[1] <= s.max + 1e-15
    assert s.count == len(xs)
    assert s.std >= 0


def test_bootstrap_is_seeded_and_the_ci_narrows_with_more_runs() -> None:
    rng = np.random.default_rng(3)
    small, big = rng.lognormal(0, 0.2, 50), rng.lognormal(0, 0.2, 5000)
    assert bootstrap_median_ci(small, seed=1) == bootstrap_median_ci(small, seed=1)
    lo_s, hi_s = bootstrap_median_ci(small)
    lo_b, hi_b = bootstrap_median_ci(big)
    assert hi_b - lo_b < hi_s - lo_s
    assert lo_b <= np.median(big) <= hi_b


def test_throughput_uses_wall_time_and_batch() -> None:
    s = summarize([0.01] * 100, wall_s=0.5, items_per_run=4)
    assert s.inferences_per_s == pytest.approx(200.0)
    assert s.items_per_s == pytest.approx(800.0)
    back_to_back = summarize([0.01] * 100)
    assert back_to_back.inferences_per_s == pytest.approx(100.0)


def test_noise_flag() -> None:
    steady = summarize(np.full(500, 1e-3) + np.linspace(0, 1e-5, 500))
    assert not steady.noisy and steady.to_dict()["noisy"] is False
    wild = summarize(np.random.default_rng(0).uniform(1e-3, 5e-3, 500))
    assert wild.noisy and any("spread" in r for r in wild.noise_reasons)
    assert summarize([1e-3] * 3).noisy  # too few runs to trust


def test_to_dict_reports_milliseconds() -> None:
    d = summarize([0.002, 0.004, 0.003]).to_dict()
    assert d["p50_ms"] == pytest.approx(3.0)
    for key in (
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
    ):
        assert key in d


def test_ratio_of_an_exact_multiple() -> None:
    a = np.random.default_rng(1).lognormal(0, 0.1, 400)
    blocks = np.arange(400) // 4
    for kwargs in ({}, {"a_blocks": blocks, "b_blocks": blocks}):
        ratio, lo, hi = bootstrap_ratio_ci(a, a * 2, **kwargs)
        assert ratio == pytest.approx(2.0)
        assert lo <= 2.0 + 1e-9 and hi >= 2.0 - 1e-9
    assert paired_ratio_ci(a, a * 2, blocks, blocks) == pytest.approx((2.0, 2.0, 2.0))


def test_paired_ratio_cancels_drift_between_rounds() -> None:
    """The machine slows down 3x halfway; B is 10% slower than A in every round."""
    rng = np.random.default_rng(5)
    rounds = np.repeat(np.arange(100), 5)
    speed = np.where(rounds < 50, 1.0, 3.0)
    a = speed * rng.lognormal(0, 0.02, rounds.size)
    b = 1.1 * speed * rng.lognormal(0, 0.02, rounds.size)
    ratio, lo, hi = paired_ratio_ci(a, b, rounds, rounds)
    assert lo > 1.05 and hi < 1.15 and lo <= ratio <= hi
