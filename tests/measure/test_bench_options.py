"""``measure.options``: ``BenchOptions`` (defaults, checks, JSON) and the records a benchmark takes as keywords."""

from __future__ import annotations

import json

import pytest

from ortpilot.errors import UsageError
from ortpilot.measure.options import DEFAULT_DURATION_S, BenchConfig, BenchOptions, bench_records


def test_defaults_and_the_budget_they_give():
    options = BenchOptions()
    assert options.runs is None and options.duration_s is None and options.warmup == "auto"
    assert options.budget == (None, DEFAULT_DURATION_S)  # neither given: the default duration
    assert BenchOptions(runs=20).budget == (20, None) and BenchOptions(duration_s=0.5).budget == (None, 0.5)
    assert BenchOptions(runs=20.0).runs == 20 and isinstance(BenchOptions(runs=20.0).runs, int)


@pytest.mark.parametrize(
    ("fields", "said"),
    [
        ({"runs": 0}, "run count must be a positive integer"),
        ({"runs": 5, "duration_s": 1.0}, "not both"),
        ({"duration_s": -1.0}, "duration must be a positive"),
        ({"warmup": -1}, "Warm-up must be"),
        ({"warmup": "later"}, "Warm-up must be"),
        ({"block": 0}, "block"),
        ({"policy": "sometimes"}, "Unknown policy"),
        ({"settle_s": -0.1}, "settle_s"),
    ],
)
def test_bad_values_are_usage_errors(fields, said):
    with pytest.raises(UsageError, match=said):
        BenchOptions(**fields)


def test_to_dict_round_trips():
    options = BenchOptions(runs=50, warmup=3, block=4, policy="strict", roofline=True, seed=7, settle_s=0.01)
    assert BenchOptions.from_dict(json.loads(json.dumps(options.to_dict()))) == options
    with pytest.raises(UsageError, match="unknown fields: colour"):
        BenchOptions.from_dict({"colour": "red"})


def test_keywords_build_both_records_and_refuse_what_neither_takes():
    config, options = bench_records("m.onnx", None, {"runs": 10, "iobinding": True, "name": "x"})
    assert config == BenchConfig(name="x", model="m.onnx", iobinding=True) and options == BenchOptions(runs=10)
    given = BenchConfig(model="m.onnx")
    assert bench_records(given, BenchOptions(runs=3), {}) == (given, BenchOptions(runs=3))
    with pytest.raises(UsageError, match="Unknown arguments: colour"):
        bench_records("m.onnx", None, {"colour": "red"})
    with pytest.raises(UsageError, match="BenchOptions or its fields"):
        bench_records("m.onnx", BenchOptions(), {"runs": 3})
    with pytest.raises(UsageError, match="BenchConfig or its fields"):
        bench_records(given, None, {"iobinding": True})
