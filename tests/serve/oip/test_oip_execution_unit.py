"""serve.oip.execution and serve.oip.reporting: a runner on a real strict CPU session of the demo MLP
(unknown outputs refused, a bad request in a stacked batch fails alone) and a standalone replica's
reporter, which has no server-wide application to tell."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from ortpilot.errors import OrtpilotError
from ortpilot.serve.counts import RequestCounts
from ortpilot.serve.oip.config import ReplicaConfig
from ortpilot.serve.oip.execution import ModelRunner, load_verified, thread_note
from ortpilot.serve.oip.metrics import BatchCounts
from ortpilot.serve.oip.reporting import Reporter
from ortpilot.serve.options import ModelSpec


@pytest.fixture(scope="module")
def runner(demo_paths) -> ModelRunner:
    session, facts = load_verified(ModelSpec("m", "model", str(demo_paths["mlp"])), threads=1)
    assert facts["mode"] == "not checked" and "strict CPU session" in facts["why"]
    return ModelRunner("m", session, ReplicaConfig(cpus=1.0, max_batch=4, batch_dim=True))


def test_unknown_outputs_are_a_400_naming_the_real_ones(runner):
    result = asyncio.run(runner.infer({"x": np.zeros((1, 64), np.float32)}, ["nope"]))
    assert result.status == 400 and "'nope'" in result.error and "y" in result.error


def test_a_bad_request_in_a_stacked_batch_fails_alone(runner):
    good = {"x": np.ones((1, 64), np.float32)}
    bad = {"x": np.ones((1, 64), np.float64)}  # checked feeds never look like this: the run refuses it
    out = runner._run_group([good, bad, good])
    assert isinstance(out[1], OrtpilotError)
    np.testing.assert_array_equal(out[0]["y"], out[2]["y"])
    assert runner.counts.snapshot().count >= 3  # the stacked try, then one run each


def test_thread_note_only_when_threads_differ_and_names_the_option_that_keeps_the_tuned_count():
    assert thread_note(2, 2) == ""
    assert "tuned with ORT's default pool" in thread_note(2, 0)  # a kept default: ORT chose and pinned its threads
    assert "tuned with 4" in thread_note(2, 4)
    assert thread_note(2, 0, profile=False) == ""  # a plain model was never tuned: no pool to compare with
    more = thread_note(2, 1)  # the replica got 2 CPUs, the tune chose 1 thread
    assert "to keep the tuned count, serve with --cpus-per-replica 1 " in more and "fewer replicas" not in more
    assert "(Python: ServeOptions(cpus_per_replica=1))" in more
    assert "cpus_per_replica=4)), with fewer replicas where the CPUs do not suffice" in thread_note(2, 4)


def test_a_standalone_replica_reports_to_nobody():
    reporter = Reporter("m", "r", None)
    assert reporter.handle() is None and asyncio.run(reporter.replica_infos()) is None
    reporter.report({}, BatchCounts(), RequestCounts())  # a no-op, not an error


def _held_runner_infer(runner: ModelRunner, context) -> tuple[object, int, int]:
    """(the result of ``infer`` with ``context`` while the run thread is busy, rows run before, rows run once
    the thread is free again and one more request has run after it)."""
    import threading

    hold = threading.Event()
    before = runner.counts.snapshot().sum
    runner.executor.submit(hold.wait, 30)  # the run thread is busy until the request's deadline passed
    feeds = {"x": np.ones((1, 64), np.float32)}
    try:
        result = asyncio.run(runner.infer(feeds, None, context))
    finally:
        hold.set()
    assert asyncio.run(runner.infer(feeds)).ok  # the next request runs (after the late one, if it ran)
    return result, before, runner.counts.snapshot().sum


@pytest.mark.parametrize("batching", [True, False])
def test_a_request_past_its_deadline_while_queued_is_504_and_never_run(demo_paths, batching):
    from ortpilot.serve.context import request_context
    from ortpilot.serve.records import RequestSettings

    session, _ = load_verified(ModelSpec("m", "model", str(demo_paths["mlp"])), threads=1)
    config = ReplicaConfig(cpus=1.0, max_batch=4 if batching else 1, batch_dim=True)
    runner = ModelRunner("m", session, config)
    assert (runner.batcher is not None) == batching
    context = request_context({"x-request-timeout": "0.2", "x-request-id": "late"}, RequestSettings(), "oip", "m")
    result, before, after = _held_runner_infer(runner, context)
    assert result.status == 504 and result.outputs == {} and "deadline of 0.2 s" in result.error
    assert after == before + 1  # only the next request ran: the late one never did
