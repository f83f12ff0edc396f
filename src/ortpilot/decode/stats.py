"""What a continuous-batching engine has done, as cumulative plain data for a server's ``/metrics``.

Counters only grow and histograms are cumulative buckets (Prometheus' shape: ``le`` bounds, a
count per bound including everything below it, ``+Inf`` last, a sum and a count), so a server
can add the reports of many replicas and expose them without the decode layer importing a
metrics library.
"""

from __future__ import annotations

import bisect
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

TTFT_BUCKETS_S = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
ITL_BUCKETS_S = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0)
ROWS_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128)


class Histogram:
    """Counts per upper bound (cumulative on export), their sum and count."""

    def __init__(self, bounds: Sequence[float]) -> None:
        self.bounds = tuple(bounds)
        self._counts = [0] * (len(self.bounds) + 1)
        self.sum = 0.0
        self.count = 0

    def observe(self, value: float) -> None:
        self._counts[bisect.bisect_left(self.bounds, value)] += 1
        self.sum += value
        self.count += 1

    def to_dict(self) -> dict[str, Any]:
        """``buckets``: [[le, cumulative count], ...] ending with ["+Inf", count]; ``sum``; ``count``."""
        running, buckets = 0, []
        for bound, n in zip([*self.bounds, "+Inf"], self._counts):
            running += n
            buckets.append([bound, running])
        return {"buckets": buckets, "sum": self.sum, "count": self.count}


@dataclass
class EngineStats:
    """The scheduler's cumulative counters and latency histograms (``Scheduler.counters()`` adds gauges)."""

    requests: int = 0
    rejected: int = 0  # QueueFullError
    prompt_tokens: int = 0
    completion_tokens: int = 0
    prefill_tokens: int = 0  # prompt tokens that were prefilled (the rest came from the prefix cache)
    finished: Counter = field(default_factory=Counter)  # stop reason -> requests
    ttft_s: Histogram = field(default_factory=lambda: Histogram(TTFT_BUCKETS_S))
    itl_s: Histogram = field(default_factory=lambda: Histogram(ITL_BUCKETS_S))
    rows_per_step: Histogram = field(default_factory=lambda: Histogram(ROWS_BUCKETS))
    steps_by_rows: Counter = field(default_factory=Counter)  # exact rows -> decode steps

    def token(self, first: bool, since_s: float) -> None:
        """A token handed to a stream: ``since_s`` from its arrival (the first) or its previous token."""
        self.completion_tokens += 1
        (self.ttft_s if first else self.itl_s).observe(since_s)

    def step(self, rows: int) -> None:
        self.rows_per_step.observe(rows)
        self.steps_by_rows[rows] += 1

    def to_dict(self) -> dict[str, Any]:
        return {
            "requests": self.requests,
            "rejected": self.rejected,
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "prefill_tokens": self.prefill_tokens,
            "finished": dict(self.finished),
            "ttft_seconds": self.ttft_s.to_dict(),
            "inter_token_seconds": self.itl_s.to_dict(),
            "rows_per_step": {**self.rows_per_step.to_dict(), "exact": dict(sorted(self.steps_by_rows.items()))},
        }


__all__ = ["ITL_BUCKETS_S", "ROWS_BUCKETS", "TTFT_BUCKETS_S", "EngineStats", "Histogram"]
