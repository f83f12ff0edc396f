"""The warm-up at load: which sizes, in what order, requests made at any size from a real one, and a real ORT
session run once at each (``session.warmup``)."""

from __future__ import annotations

import numpy as np
import pytest

import ortpilot
from ortpilot.errors import UsageError
from ortpilot.session.warmup import (
    MAX_WARM_BYTES,
    Warmed,
    WarmupPlan,
    at_size,
    base_request,
    first_run_cost,
    plan_problem,
    probe_sizes,
    sizes_to_warm,
    warm_at_sizes,
    worth_warming,
)

AXES = (("input_ids", 1), ("attention_mask", 1), ("token_type_ids", 1))


def _request(n: int) -> dict[str, np.ndarray]:
    ids = np.arange(10, 10 + n, dtype=np.int64)[None, :]
    return {"input_ids": ids, "attention_mask": np.ones_like(ids), "token_type_ids": np.zeros_like(ids)}


def test_the_sizes_seen_most_come_first_then_the_rest_of_the_range():
    assert sizes_to_warm([(5, 1), (9, 4), (7, 4), (12, 2)]) == (7, 9, 12, 5, 6, 8, 10, 11)
    assert sizes_to_warm([]) == ()


def test_a_range_wider_than_the_limit_keeps_every_size_seen_and_samples_the_rest():
    sizes = sizes_to_warm([(1, 3), (1000, 1)], limit=10)
    assert sizes[:2] == (1, 1000) and len(sizes) == 10 and len(set(sizes)) == 10
    assert all(1 < s < 1000 for s in sizes[2:]) and list(sizes[2:]) == sorted(sizes[2:])


def test_a_request_at_any_size_keeps_the_real_requests_values():
    request = _request(4)
    longer, shorter = at_size(request, AXES, 10), at_size(request, AXES, 3)
    assert longer["input_ids"].tolist() == [[10, 11, 12, 13, 10, 11, 12, 13, 10, 11]]
    assert shorter["input_ids"].tolist() == [[10, 11, 12]]
    assert longer["attention_mask"].shape == (1, 10) and set(longer["attention_mask"].ravel()) == {1}
    assert longer["input_ids"].flags["C_CONTIGUOUS"]
    assert np.array_equal(at_size(request, AXES, 4)["input_ids"], request["input_ids"])
    assert request["input_ids"].shape == (1, 4)  # the real request is left as it was


def test_probes_are_sizes_the_session_has_not_met_spread_over_the_range():
    assert probe_sizes(range(1, 101), [10, 20], count=4) == [14, 39, 64, 88]
    assert probe_sizes([3, 4, 5], [4]) == [3, 5]


def test_a_warm_up_is_worth_it_only_when_a_first_run_costs_a_share_of_a_run():
    assert worth_warming(8.1, 2.8)  # OpenVINO on MiniLM, measured
    assert not worth_warming(0.14, 4.4)  # the CPU EP on MiniLM, measured
    assert not worth_warming(0.6, 10.0)  # under a quarter of the run
    assert not worth_warming(0.3, 0.5)  # a fraction of a millisecond


def test_a_request_at_a_batch_size_is_the_request_stacked_on_axis_0():
    batched = at_size(_request(4), AXES, 6, batch=3)
    assert batched["input_ids"].shape == (3, 6) and batched["token_type_ids"].shape == (3, 6)
    assert (batched["input_ids"] == batched["input_ids"][0]).all()


def test_a_plan_travels_as_a_dict_and_a_malformed_one_is_refused():
    plan = WarmupPlan("sequence", AXES, (17, 5, 6), 8.1, 2.8, batches=(32, 1))
    assert WarmupPlan.from_dict(plan.to_dict()) == plan and plan.batches == (1, 32)
    assert plan.shapes() == [(1, 17), (1, 5), (1, 6), (32, 17), (32, 5), (32, 6)]
    assert WarmupPlan.from_dict({k: v for k, v in plan.to_dict().items() if k != "batches"}).batches == (1,)
    with pytest.raises(UsageError, match="malformed"):
        WarmupPlan.from_dict({"dim": "sequence", "sizes": [3]})
    with pytest.raises(UsageError, match="positive sizes"):
        WarmupPlan("sequence", AXES, (0,), 1.0, 1.0)


def test_a_real_session_runs_once_at_each_shape_and_answers_as_before(demo_paths):
    session = ortpilot.load(str(demo_paths["encoder"]))
    plan = WarmupPlan("sequence", AXES, sizes_to_warm([(6, 3), (2, 1), (9, 1)]), 8.0, 2.0, batches=(1, 4))
    before = session.run(None, _request(7))[0]
    warmed = warm_at_sizes(session, _request(5), plan, budget_s=600)
    assert plan.sizes == (6, 2, 9, 3, 4, 5, 7, 8) and warmed.planned == 16
    assert warmed.shapes == tuple((b, n) for b in (1, 4) for n in plan.sizes)
    assert np.array_equal(session.run(None, _request(7))[0], before)
    cut = warm_at_sizes(session, _request(5), plan, budget_s=0)
    assert cut == Warmed((), 16, pytest.approx(0.0, abs=1.0), "the 0 s budget ran out")


def test_the_first_run_cost_is_measured_on_the_session_at_new_sizes(demo_paths):
    session = ortpilot.load(str(demo_paths["encoder"]))
    first_ms, run_ms = first_run_cost(session, _request(5), AXES, [3, 8, 11])
    assert run_ms > 0 and np.isfinite(first_ms)


def test_a_batched_tunes_request_warms_from_its_first_item_and_one_without_a_batch_axis_does_not_stack():
    batched = {name: np.concatenate([value] * 32) for name, value in _request(9).items()}
    one, stacks = base_request(batched, AXES)
    assert stacks and one["input_ids"].shape == (1, 9) and np.array_equal(one["input_ids"], _request(9)["input_ids"])
    with_scalar = {**_request(9), "temperature": np.float32(0.5)}
    same, stacks = base_request(with_scalar, AXES)
    assert not stacks and same["input_ids"].shape == (1, 9)
    with pytest.raises(ValueError, match="does not stack"):
        at_size(same, AXES, 12, batch=4)
    flat = {"input_ids": np.arange(9, dtype=np.int64)}  # a [sequence] model: axis 0 is the dim itself
    assert base_request(flat, (("input_ids", 0),))[1] is False


def test_a_plan_that_does_not_fit_its_workload_is_named_before_anything_runs():
    dim = {"name": "sequence", "axes": [list(a) for a in AXES], "min": 3, "max": 40}
    workload = {"dims": [dim], "batches": [1, 32]}
    plan = WarmupPlan("sequence", AXES, tuple(range(3, 41)), 8.0, 2.0, batches=(1, 32))
    assert plan_problem(plan, workload, _request(9)) == ""
    wide = WarmupPlan("sequence", AXES, (3, 2**30), 8.0, 2.0)
    assert "not those of the workload's 'sequence' (3-40" in plan_problem(wide, workload, _request(9))
    batches = WarmupPlan("sequence", AXES, (3, 4), 8.0, 2.0, batches=(1, 4096))
    assert "batch sizes [1, 4096] are not the workload's [1, 32]" in plan_problem(batches, workload, _request(9))
    other = WarmupPlan("width", AXES, (3,), 8.0, 2.0)
    assert plan_problem(other, workload, _request(9)) == "its workload has no dim 'width'"
    twice = WarmupPlan("sequence", (("input_ids", 0), ("input_ids", 1)), (40,), 8.0, 2.0)  # an edited plan
    assert "axes [['input_ids', 0], ['input_ids', 1]] are not those" in plan_problem(twice, workload, _request(9))
    broken = {"dims": [{**dim, "min": [1]}], "batches": [1]}
    assert plan_problem(plan, broken, _request(9)) == "its workload's 'sequence' is malformed"
    huge = {"dims": [{**dim, "max": 2**26}], "batches": [1, 32]}
    big = WarmupPlan("sequence", AXES, (2**26,), 8.0, 2.0, batches=(1, 32))
    # three int64 inputs of 2**26 tokens, 32 times over: 48 GiB
    assert plan_problem(big, huge, _request(9)) == "its largest warm-up request would take 49152 MiB of inputs"
    assert MAX_WARM_BYTES < 49152 << 20


def test_a_shape_the_session_refuses_ends_the_warm_up_there_and_says_so(demo_paths):
    session = ortpilot.load(str(demo_paths["encoder"]))  # 512 positions
    plan = WarmupPlan("sequence", AXES, (8, 600, 9), 8.0, 2.0)
    warmed = warm_at_sizes(session, _request(5), plan, budget_s=600)
    assert warmed.shapes == ((1, 8),) and warmed.planned == 3
    assert warmed.note.startswith("stopped at batch 1, size 600: OrtRunError") and "stopped" in warmed.describe()
    assert session.run(None, _request(9))[0].shape[:2] == (1, 9)
