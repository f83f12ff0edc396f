"""serve.options' CPU share: the replicas that start share the CPU budget from the start (fractions of a
CPU when there are more replicas than CPUs, rounded down to Ray's step so that all of them fit), ORT's
intra-op threads never sum past the budget where a whole CPU each fits, and ``--cpus-per-replica`` that
cannot fit a local Ray instance is an exit 2 before anything starts."""

from __future__ import annotations

import pytest

from ortpilot.errors import UsageError
from ortpilot.serve.options import CPU_STEP, DecoderOptions, ServeOptions, ServerOptions, cpu_share, ort_threads


def test_more_replicas_than_cpus_get_a_fraction_each_that_fits():
    assert cpu_share(2, 3) == 0.6666 and 3 * cpu_share(2, 3) <= 2
    assert ServeOptions().replica_cpus(models=3, budget=2) == 0.6666
    assert ServeOptions(replicas=2).replica_cpus(models=3, budget=2) == 0.3333
    assert ServeOptions(autoscale=(2, 5)).replica_cpus(models=1, budget=3) == 1.5  # the replicas that start
    assert ort_threads(0.6666) == 1 and ort_threads(1.5) == 1 and ort_threads(2.0) == 2


@pytest.mark.parametrize("budget", [1, 2, 3, 4, 7, 16])
def test_every_share_fits_and_whole_cpus_give_threads_within_the_budget(budget):
    for replicas in range(1, 3 * budget + 1):
        share = cpu_share(budget, replicas)
        assert share * replicas <= budget and share > 0
        assert abs(share * CPU_STEP - round(share * CPU_STEP)) < 1e-6  # a quantity in Ray's steps
        if replicas <= budget:
            assert replicas * ort_threads(share) <= budget
        else:
            assert ort_threads(share) == 1  # one thread each: they take turns on the budget's CPUs


def test_cpus_per_replica_that_cannot_all_start_is_refused_naming_what_fits():
    ServeOptions().check_fit(models=3, budget=2)  # shared: fits
    ServeOptions(cpus_per_replica=0.6666).check_fit(models=3, budget=2)
    ServeOptions(cpus_per_replica=1).check_fit(models=2, budget=2)
    with pytest.raises(UsageError) as info:
        ServeOptions(cpus_per_replica=1).check_fit(models=3, budget=2)
    message = str(info.value)
    assert "asks 3 replica(s) (3 model(s) x 1) for 3 CPUs" in message and "CPU budget is 2" in message
    assert "only 2 would start now" in message and "Leave --cpus-per-replica out" in message and "0.6666" in message
    with pytest.raises(UsageError, match="only 1 would start now"):
        ServeOptions(replicas=2, cpus_per_replica=1.5).check_fit(models=1, budget=2)


NAN, INF = float("nan"), float("inf")


@pytest.mark.parametrize(
    "make, flag",
    [
        (lambda: ServeOptions(cpus_per_replica=INF), "--cpus-per-replica"),
        (lambda: ServeOptions(cpus_per_replica=NAN), "--cpus-per-replica"),
        (lambda: ServeOptions(batch_wait_ms=NAN), "--batch-wait-ms"),
        (lambda: ServeOptions(batch_wait_ms=1e9), "--batch-wait-ms"),
        (lambda: ServeOptions(max_request_mb=INF), "--max-request-mb"),  # was a traceback (int(inf))
        (lambda: ServeOptions(max_request_mb=NAN), "--max-request-mb"),
        (lambda: ServeOptions(max_request_mb=1e9), "--max-request-mb"),  # over gRPC's int32 message size
        (lambda: ServerOptions(ready_timeout=NAN), "--ready-timeout"),  # a deadline never reached
        (lambda: ServerOptions(ready_timeout=0), "--ready-timeout"),
        (lambda: DecoderOptions(prefix_cache_mb=INF), "--prefix-cache-mb"),
        (lambda: DecoderOptions(prefix_cache_mb=NAN), "--prefix-cache-mb"),
    ],
)
def test_a_number_that_is_no_bound_is_refused_naming_its_flag(make, flag):
    # nan passes every comparison a bound is written with; inf overflowed where a count was made of it
    with pytest.raises(UsageError, match=flag):
        make()
