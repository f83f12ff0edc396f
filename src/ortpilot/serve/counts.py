"""What both stacks count the same way: a replica's cumulative requests by status and their latency
histogram, the heartbeat that carries them to the one application that renders ``/metrics``, and
Prometheus' cumulative buckets of summed histograms. Replicas are separate processes, so each keeps
cumulative state and reports it (every ``HEARTBEAT_S``, and after requests at most every
``REPORT_S``); a report older than ``REPLICA_TTL_S`` is a replica that is gone.
"""

from __future__ import annotations

import bisect
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

HEARTBEAT_S = 2.0
REPORT_S = 0.5  # a replica reports after a request at most this often (the heartbeat covers quiet times)
REPLICA_TTL_S = 3 * HEARTBEAT_S + 1.0
SECONDS_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)


@dataclass(frozen=True)
class RequestSnapshot:
    """A replica's cumulative requests at one moment (``RequestCounts.snapshot``): what a heartbeat carries
    across Ray. ``codes``: requests by status code; ``buckets``: the latency histogram (``SECONDS_BUCKETS``
    and +Inf), not cumulative."""

    codes: Mapping[str, int] = field(default_factory=dict)
    buckets: tuple[int, ...] = ()
    sum: float = 0.0
    count: int = 0

    def to_dict(self) -> dict[str, Any]:
        return {"codes": dict(self.codes), "buckets": list(self.buckets), "sum": self.sum, "count": self.count}

    @classmethod
    def from_dict(cls, doc: Mapping[str, Any]) -> RequestSnapshot:
        codes = {str(k): int(n) for k, n in doc["codes"].items()}
        return cls(codes, tuple(int(n) for n in doc["buckets"]), float(doc["sum"]), int(doc["count"]))


class RequestCounts:
    """A replica's cumulative requests by status code and their latency histogram (seconds)."""

    def __init__(self) -> None:
        self.codes: dict[str, int] = {}
        self.buckets = [0] * (len(SECONDS_BUCKETS) + 1)
        self.sum = 0.0
        self.count = 0

    def observe(self, code: int, seconds: float) -> None:
        key = str(code)
        self.codes[key] = self.codes.get(key, 0) + 1
        self.buckets[bisect.bisect_left(SECONDS_BUCKETS, seconds)] += 1
        self.sum += seconds
        self.count += 1

    def snapshot(self) -> RequestSnapshot:
        return RequestSnapshot(dict(self.codes), tuple(self.buckets), self.sum, self.count)


class Histogram(Protocol):
    """A snapshot with per-bucket counts (``RequestSnapshot``, the OIP stack's ``BatchSnapshot``)."""

    @property
    def buckets(self) -> tuple[int, ...]: ...


def cumulative(histograms: Sequence[Histogram], bounds: tuple) -> list[tuple[str, int]]:
    """Prometheus' cumulative buckets of the summed ``histograms`` (each with the same ``bounds`` and +Inf)."""
    buckets = [0] * (len(bounds) + 1)
    for h in histograms:
        for i, n in enumerate(h.buckets):
            if i < len(buckets):
                buckets[i] += int(n)
    out, running = [], 0
    for bound, n in zip([str(b) for b in bounds] + ["+Inf"], buckets):
        running += n
        out.append((bound, running))
    return out


__all__ = [
    "HEARTBEAT_S",
    "REPLICA_TTL_S",
    "REPORT_S",
    "SECONDS_BUCKETS",
    "Histogram",
    "RequestCounts",
    "RequestSnapshot",
    "cumulative",
]
