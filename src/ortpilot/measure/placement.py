"""Where the calling thread runs, beside the intra-op threads ORT's default session pins.

A session created without ``intra_op_num_threads`` starts one pool thread per core beyond the first and
pins each to its own CPU; the thread that calls ``run`` is not pinned and works too. When the OS puts the
caller on a CPU that holds a pinned pool thread, the two share it while another CPU idles: on a 2-CPU
VM the demo encoder's default session ran 0.45 ms with the caller on CPU 0 and 0.72 ms on CPU 1, for as
long as the OS left it there (minutes), and a session with explicit threads (pinned to nothing) 0.45 ms on
either (BENCHMARKS.md, "ORT's default session and the calling thread's CPU"). A speedup over ORT's
default therefore depends on where a user's thread happens to run. The tune's worker and every interleaved
benchmark (``verify --bench``, ``compare``) time with the caller away from the pinned CPUs, so ORT's default
is timed at its faster placement and a speedup over it is the smaller of the two;
``benchmarks/bench_default_affinity.py`` times a tuned folder both ways.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path

from ortpilot.providers.cpubudget import allowed_cpus, pinned_of, until_run


def pinned_cpus() -> set[int]:
    """The CPUs that one of this process's threads is pinned to alone (ORT's default pool threads), read
    once every thread has run (``until_run``: a thread not yet started shows no pinning)."""
    tasks = list(Path("/proc/self/task").glob("*"))
    until_run(tasks)
    return pinned_of(allowed_cpus(task / "status") for task in tasks)


def placements() -> list[frozenset[int]]:
    """Where to run the calling thread so that a bench sees both ways ORT's default session can run: on the
    process's CPUs that hold no pinned thread, and on the first one that does. [] where that choice does
    not exist (no thread pinned, every CPU pinned, one CPU, or no ``sched_setaffinity``)."""
    if not hasattr(os, "sched_getaffinity"):
        return []
    allowed = os.sched_getaffinity(0)
    pinned = pinned_cpus() & allowed
    free = allowed - pinned
    if not pinned or not free:
        return []
    return [frozenset(free), frozenset({min(pinned)})]


def away_from_pinned() -> frozenset[int] | None:
    """The CPUs to time on so that ORT's default session runs at its faster placement (None: no choice).
    Call it after the sessions exist: their pinned threads are what it avoids."""
    found = placements()
    return found[0] if found else None


@contextlib.contextmanager
def caller_on(cpus: frozenset[int] | None) -> Iterator[None]:
    """Run the calling thread on ``cpus`` for the block (None: where it is), then where it was allowed before.

    Create no session or thread inside it: a new thread inherits the caller's CPUs, so an unpinned intra-op
    pool made here would crowd onto them."""
    if not cpus:
        yield
        return
    before = os.sched_getaffinity(0)
    os.sched_setaffinity(0, cpus)
    try:
        yield
    finally:
        os.sched_setaffinity(0, before)


__all__ = ["away_from_pinned", "caller_on", "pinned_cpus", "placements"]
