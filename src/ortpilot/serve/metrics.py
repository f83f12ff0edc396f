"""Prometheus metrics for a served application, correct across replicas on one ``/metrics``.

Replicas are separate processes, so one registry cannot see them all. Two rules make the totals
right anyway. Every request passes the ingress (one replica per application), so request counts
and latencies are counted there, with plain ``prometheus_client`` metrics. What only a model
replica knows (the batches it ran, whether it verified, its placement) it reports as *cumulative*
state: in each response and in a heartbeat every ``HEARTBEAT_S``. The ingress keeps the newest
report per replica and a custom collector adds them up at scrape time; a replica that died keeps
its last batch counts in the sum (counters never go down), but leaves the verified gauge once its
heartbeat is older than ``REPLICA_TTL_S``.
"""

from __future__ import annotations

import bisect
import threading
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

HEARTBEAT_S = 2.0
REPLICA_TTL_S = 3 * HEARTBEAT_S + 1.0
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128)
SECONDS_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
UNKNOWN_MODEL = "(unknown)"  # the label for requests to names that are not served (kept out of the cardinality)


class BatchCounts:
    """A replica's cumulative batch-size histogram, small enough to ride along with every response."""

    def __init__(self) -> None:
        self.buckets = [0] * (len(BATCH_BUCKETS) + 1)  # per bucket, the last one is +Inf
        self.sum = 0
        self.count = 0

    def observe(self, size: int) -> None:
        self.buckets[bisect.bisect_left(BATCH_BUCKETS, size)] += 1
        self.sum += size
        self.count += 1

    def snapshot(self) -> dict[str, Any]:
        return {"buckets": list(self.buckets), "sum": self.sum, "count": self.count}


@dataclass
class ReplicaReport:
    """The newest state a model replica reported: who it is, what it verified, what it ran."""

    model: str
    replica: str
    info: dict[str, Any]
    batches: dict[str, Any]
    seen: float = field(default_factory=time.monotonic)

    @property
    def alive(self) -> bool:
        return time.monotonic() - self.seen <= REPLICA_TTL_S


class ServeMetrics:
    """The ingress's registry: request metrics it counts itself, and the replicas' reports summed."""

    def __init__(self, models: list[str]) -> None:
        from prometheus_client import CollectorRegistry, Counter, Histogram

        self.models = list(models)
        self.registry = CollectorRegistry(auto_describe=True)
        self.requests = Counter(
            "ortpilot_requests",
            "Infer requests by model and HTTP status code.",
            ["model", "code"],
            registry=self.registry,
        )
        self.seconds = Histogram(
            "ortpilot_request_seconds",
            "Infer request time at the ingress, seconds.",
            ["model"],
            buckets=SECONDS_BUCKETS,
            registry=self.registry,
        )
        self.registry.register(_ReplicaCollector(self))
        self._lock = threading.Lock()
        self._reports: dict[str, ReplicaReport] = {}

    def observe(self, model: str, code: int, seconds: float) -> None:
        label = model if model in self.models else UNKNOWN_MODEL
        self.requests.labels(label, str(code)).inc()
        self.seconds.labels(label).observe(seconds)

    def report(self, model: str, replica: str, info: Mapping[str, Any] | None, batches: Mapping[str, Any]) -> None:
        """Take a replica's report (heartbeat or response); older batch counts never replace newer ones."""
        with self._lock:
            old = self._reports.get(replica)
            if old is None:
                if info is None:  # a response from a replica whose registration is still on its way
                    info = {}
                self._reports[replica] = ReplicaReport(model, replica, dict(info), dict(batches))
                return
            if info:
                old.info = dict(info)
            if int(batches.get("count", 0)) >= int(old.batches.get("count", 0)):
                old.batches = dict(batches)
            old.seen = time.monotonic()

    def replicas(self, model: str) -> list[ReplicaReport]:
        """The model's live replicas that reported as verified."""
        with self._lock:
            return [r for r in self._reports.values() if r.model == model and r.alive and r.info.get("verified")]

    def all_reports(self) -> list[ReplicaReport]:
        with self._lock:
            return list(self._reports.values())

    def render(self) -> tuple[bytes, str]:
        from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

        return generate_latest(self.registry), CONTENT_TYPE_LATEST


class _ReplicaCollector:
    """Builds the replica-side families at scrape time from the newest report of each replica."""

    def __init__(self, metrics: ServeMetrics) -> None:
        self.metrics = metrics

    def describe(self) -> list:
        return []

    def collect(self) -> Iterator[Any]:
        from prometheus_client.core import GaugeMetricFamily, HistogramMetricFamily

        reports = self.metrics.all_reports()
        batch = HistogramMetricFamily(
            "ortpilot_batch_size",
            "Requests per model run (dynamic batching), summed over every replica that ran.",
            labels=["model"],
        )
        verified = GaugeMetricFamily(
            "ortpilot_replica_verified",
            "Live replicas that loaded their profile and reproduced its reference outputs.",
            labels=["model"],
        )
        share = GaugeMetricFamily(
            "ortpilot_placement_share",
            "Share of the model's nodes on each provider, as the verified replicas report it.",
            labels=["model", "provider"],
        )
        for model in self.metrics.models:
            mine = [r for r in reports if r.model == model]
            buckets = [0] * (len(BATCH_BUCKETS) + 1)
            total = 0
            for r in mine:
                for i, n in enumerate(r.batches.get("buckets") or []):
                    if i < len(buckets):
                        buckets[i] += int(n)
                total += int(r.batches.get("sum", 0))
            cumulative, running = [], 0
            for bound, n in zip([str(b) for b in BATCH_BUCKETS] + ["+Inf"], buckets):
                running += n
                cumulative.append((bound, running))
            batch.add_metric([model], cumulative, sum_value=total)
            live = [r for r in mine if r.alive and r.info.get("verified")]
            verified.add_metric([model], len(live))
            shares: dict[str, list[float]] = {}
            for r in live:
                for provider, value in (r.info.get("placement_share") or {}).items():
                    shares.setdefault(provider, []).append(float(value))
            for provider, values in sorted(shares.items()):
                share.add_metric([model, provider], sum(values) / len(values))
        yield batch
        yield verified
        yield share


__all__ = ["BATCH_BUCKETS", "HEARTBEAT_S", "REPLICA_TTL_S", "BatchCounts", "ReplicaReport", "ServeMetrics"]
