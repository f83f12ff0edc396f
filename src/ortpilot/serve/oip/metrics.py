"""Prometheus metrics for a served application, correct across replicas on one ``/metrics``.

Replicas are separate processes and answer their requests themselves (one hop), so one registry
cannot see them all. Each replica keeps its counts as *cumulative* state (requests by status,
their latencies, the batches it ran) and reports it with what it verified in a heartbeat every
``HEARTBEAT_S`` and after requests (at most every ``REPORT_S``). The server-wide application keeps
the newest report per replica and a custom collector adds them up at scrape time, so a scrape
lags the replicas by at most a heartbeat. A replica that died keeps its last counts in the sums
(counters never go down) but leaves the verified gauge once its heartbeat is older than
``REPLICA_TTL_S``. Requests the server-wide application answers itself (unknown models, models
with no ready replica) it counts with plain ``prometheus_client`` metrics.
"""

from __future__ import annotations

import bisect
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ortpilot.serve.counts import REPLICA_TTL_S, SECONDS_BUCKETS, RequestCounts, RequestSnapshot, cumulative
from ortpilot.serve.oip.replicainfo import ReplicaInfo

BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128)
FILL_BUCKETS = (0.25, 0.5, 0.6, 0.7, 0.8, 0.9, 0.95, 1.0)  # real tokens / padded positions of one run
UNKNOWN_MODEL = "(unknown)"  # the label for requests to names that are not served (kept out of the cardinality)


@dataclass(frozen=True)
class BatchSnapshot:
    """A replica's cumulative batch sizes at one moment (``BatchCounts.snapshot``): ``buckets`` per
    ``BATCH_BUCKETS`` and +Inf, not cumulative."""

    buckets: tuple[int, ...] = ()
    sum: int = 0
    count: int = 0

    def to_dict(self) -> dict[str, Any]:
        return {"buckets": list(self.buckets), "sum": self.sum, "count": self.count}

    @classmethod
    def from_dict(cls, doc: Mapping[str, Any]) -> BatchSnapshot:
        return cls(tuple(int(n) for n in doc["buckets"]), int(doc["sum"]), int(doc["count"]))


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

    def snapshot(self) -> BatchSnapshot:
        return BatchSnapshot(tuple(self.buckets), self.sum, self.count)


def _histogram(bounds: tuple, value: float, buckets: list[int]) -> None:
    buckets[bisect.bisect_left(bounds, value)] += 1


@dataclass(frozen=True)
class TextSnapshot:
    """A text model replica's cumulative text batching at one moment (``TextCounts.snapshot``): texts per
    session run, each run's fill (real tokens / padded positions), requests joined per batch (one
    ``TextModel`` call), and the real and padded token positions run; buckets not cumulative."""

    texts: tuple[int, ...] = ()
    texts_sum: int = 0
    fill: tuple[int, ...] = ()
    fill_sum: float = 0.0
    runs: int = 0
    requests: tuple[int, ...] = ()
    requests_sum: int = 0
    batches: int = 0
    tokens: int = 0
    padded: int = 0

    def to_dict(self) -> dict[str, Any]:
        return {
            "texts": list(self.texts),
            "texts_sum": self.texts_sum,
            "fill": list(self.fill),
            "fill_sum": self.fill_sum,
            "runs": self.runs,
            "requests": list(self.requests),
            "requests_sum": self.requests_sum,
            "batches": self.batches,
            "tokens": self.tokens,
            "padded": self.padded,
        }

    @classmethod
    def from_dict(cls, doc: Mapping[str, Any] | None) -> TextSnapshot:
        doc = dict(doc or {})
        for key in ("texts", "fill", "requests"):
            doc[key] = tuple(int(n) for n in doc.get(key, ()))
        return cls(**doc)


class TextCounts:
    """A text model replica's cumulative text batching (see ``TextSnapshot``), counted after each batch."""

    def __init__(self) -> None:
        self.texts = [0] * (len(BATCH_BUCKETS) + 1)
        self.fill = [0] * (len(FILL_BUCKETS) + 1)
        self.requests = [0] * (len(BATCH_BUCKETS) + 1)
        self.fill_sum = 0.0
        self.texts_sum = self.runs = self.requests_sum = self.batches = self.tokens = self.padded = 0

    def observe(self, runs: Sequence[tuple[int, int, int]], requests: int) -> None:
        """One batch: each session run's (texts, real tokens, padded positions), and the requests it joined."""
        for texts, tokens, padded in runs:
            fill = tokens / padded if padded else 1.0
            _histogram(BATCH_BUCKETS, texts, self.texts)
            self.texts_sum += texts
            _histogram(FILL_BUCKETS, fill, self.fill)
            self.fill_sum += fill
            self.runs += 1
            self.tokens += tokens
            self.padded += padded
        _histogram(BATCH_BUCKETS, requests, self.requests)
        self.requests_sum += requests
        self.batches += 1

    def snapshot(self) -> TextSnapshot:
        return TextSnapshot(
            tuple(self.texts),
            self.texts_sum,
            tuple(self.fill),
            self.fill_sum,
            self.runs,
            tuple(self.requests),
            self.requests_sum,
            self.batches,
            self.tokens,
            self.padded,
        )


@dataclass(frozen=True)
class Heartbeat:
    """What a model replica sends the server-wide application across Ray: who it is, what it verified
    (``ReplicaInfo``, which model metadata lists) and its cumulative counts (snapshots small enough to
    send after every request)."""

    model: str
    replica: str
    info: ReplicaInfo
    batches: BatchSnapshot = field(default_factory=BatchSnapshot)
    requests: RequestSnapshot = field(default_factory=RequestSnapshot)
    text: TextSnapshot = field(default_factory=TextSnapshot)  # a text model's batching (empty otherwise)

    def to_dict(self) -> dict[str, Any]:
        return {
            "model": self.model,
            "replica": self.replica,
            "info": self.info.to_dict(),
            "batches": self.batches.to_dict(),
            "requests": self.requests.to_dict(),
            "text": self.text.to_dict(),
        }

    @classmethod
    def from_dict(cls, doc: Mapping[str, Any]) -> Heartbeat:
        return cls(
            str(doc["model"]),
            str(doc["replica"]),
            ReplicaInfo.from_dict(doc["info"]),
            BatchSnapshot.from_dict(doc["batches"]),
            RequestSnapshot.from_dict(doc["requests"]),
            TextSnapshot.from_dict(doc.get("text")),
        )


@dataclass
class ReplicaReport:
    """The newest state a model replica reported: who it is, what it verified, what it ran."""

    model: str
    replica: str
    info: ReplicaInfo
    batches: BatchSnapshot
    requests: RequestSnapshot
    text: TextSnapshot = field(default_factory=TextSnapshot)
    seen: float = field(default_factory=time.monotonic)

    @property
    def alive(self) -> bool:
        return time.monotonic() - self.seen <= REPLICA_TTL_S


class ServeMetrics:
    """The ingress's registry: request metrics it counts itself, and the replicas' reports summed."""

    def __init__(self, models: list[str]) -> None:
        from prometheus_client import CollectorRegistry

        self.models = list(models)
        self.registry = CollectorRegistry(auto_describe=True)
        self.registry.register(_ReplicaCollector(self))
        self._lock = threading.Lock()
        self._reports: dict[str, ReplicaReport] = {}
        self._local: dict[str, RequestCounts] = {}  # requests this application answered itself

    def observe(self, model: str, code: int, seconds: float) -> None:
        """A request the server-wide application answered itself (no replica saw it)."""
        label = model if model in self.models else UNKNOWN_MODEL
        with self._lock:
            self._local.setdefault(label, RequestCounts()).observe(code, seconds)

    def local_requests(self, label: str) -> RequestSnapshot | None:
        """The requests under ``label`` this application answered itself (None: none)."""
        with self._lock:
            counts = self._local.get(label)
            return counts.snapshot() if counts else None

    def report(self, beat: Heartbeat) -> None:
        """Take a replica's heartbeat; older counts never replace newer ones (heartbeats may cross)."""
        with self._lock:
            old = self._reports.get(beat.replica)
            if old is None:
                self._reports[beat.replica] = ReplicaReport(
                    beat.model, beat.replica, beat.info, beat.batches, beat.requests, beat.text
                )
                return
            old.info = beat.info
            if beat.batches.count >= old.batches.count:
                old.batches = beat.batches
            if beat.text.batches >= old.text.batches:
                old.text = beat.text
            if beat.requests.count >= old.requests.count:
                old.requests = beat.requests
            old.seen = time.monotonic()

    def replicas(self, model: str) -> list[ReplicaReport]:
        """The model's live replicas that reported as verified."""
        with self._lock:
            return [r for r in self._reports.values() if r.model == model and r.alive and r.info.verified]

    def all_reports(self) -> list[ReplicaReport]:
        with self._lock:
            return list(self._reports.values())

    def render(self) -> tuple[bytes, str]:
        from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

        return generate_latest(self.registry), CONTENT_TYPE_LATEST


def _add_requests(requests: Any, seconds: Any, model: str, counted: list[RequestSnapshot]) -> None:
    codes: dict[str, int] = {}
    for c in counted:
        for code, n in c.codes.items():
            codes[code] = codes.get(code, 0) + n
    for code, n in sorted(codes.items()):
        requests.add_metric([model, code], n)
    seconds.add_metric([model], cumulative(counted, SECONDS_BUCKETS), sum_value=sum(c.sum for c in counted))


class _ReplicaCollector:
    """Builds the replica-side families at scrape time from the newest report of each replica."""

    def __init__(self, metrics: ServeMetrics) -> None:
        self.metrics = metrics

    def describe(self) -> list:
        return []

    def collect(self) -> Iterator[Any]:
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily

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
        requests = CounterMetricFamily(
            "ortpilot_requests",
            "Requests by model and HTTP status code, summed over every replica.",
            labels=["model", "code"],
        )
        seconds = HistogramMetricFamily(
            "ortpilot_request_seconds", "Request time where it was answered (a replica), seconds.", labels=["model"]
        )
        text = _TextFamilies()
        for model in [*self.metrics.models, UNKNOWN_MODEL]:
            local = self.metrics.local_requests(model)
            mine = [r for r in reports if r.model == model]
            counted = [r.requests for r in mine] + ([local] if local is not None else [])
            if model == UNKNOWN_MODEL:
                if local is not None:
                    _add_requests(requests, seconds, model, counted)
                continue
            batches = [r.batches for r in mine]
            batch.add_metric([model], cumulative(batches, BATCH_BUCKETS), sum_value=sum(b.sum for b in batches))
            live = [r for r in mine if r.alive and r.info.verified]
            verified.add_metric([model], len(live))
            shares: dict[str, list[float]] = {}
            for r in live:
                for provider, value in r.info.placement_share.items():
                    shares.setdefault(provider, []).append(float(value))
            for provider, values in sorted(shares.items()):
                share.add_metric([model, provider], sum(values) / len(values))
            _add_requests(requests, seconds, model, counted)
            text.add(model, [r.text for r in mine])
        yield batch
        yield verified
        yield share
        yield requests
        yield seconds
        yield from text.families()


class _TextFamilies:
    """The text models' batching families, summed over each model's replicas (models that ran text only)."""

    def __init__(self) -> None:
        from prometheus_client.core import CounterMetricFamily, HistogramMetricFamily

        self.texts = HistogramMetricFamily(
            "ortpilot_text_run_texts", "Texts per session run of a text model (one padded rectangle).", labels=["model"]
        )
        self.fill = HistogramMetricFamily(
            "ortpilot_text_run_fill",
            "Share of a text run's padded positions that held real tokens (1: no padding).",
            labels=["model"],
        )
        self.requests = HistogramMetricFamily(
            "ortpilot_text_batch_requests",
            "Requests joined in one text batch (a run of the replica's text model).",
            labels=["model"],
        )
        self.tokens = CounterMetricFamily(
            "ortpilot_text_tokens",
            "Token positions a text model ran: real tokens, and padded positions (real ones included).",
            labels=["model", "kind"],
        )

    def add(self, model: str, snapshots: Sequence[TextSnapshot]) -> None:
        counted = [s for s in snapshots if s.batches]
        if not counted:
            return
        texts = [BatchSnapshot(s.texts) for s in counted]
        fills = [BatchSnapshot(s.fill) for s in counted]
        requests = [BatchSnapshot(s.requests) for s in counted]
        self.texts.add_metric([model], cumulative(texts, BATCH_BUCKETS), sum_value=sum(s.texts_sum for s in counted))
        self.fill.add_metric([model], cumulative(fills, FILL_BUCKETS), sum_value=sum(s.fill_sum for s in counted))
        self.requests.add_metric(
            [model], cumulative(requests, BATCH_BUCKETS), sum_value=sum(s.requests_sum for s in counted)
        )
        self.tokens.add_metric([model, "real"], sum(s.tokens for s in counted))
        self.tokens.add_metric([model, "padded"], sum(s.padded for s in counted))

    def families(self) -> Iterator[Any]:
        yield self.texts
        yield self.fill
        yield self.requests
        yield self.tokens


__all__ = [
    "BATCH_BUCKETS",
    "FILL_BUCKETS",
    "UNKNOWN_MODEL",
    "BatchCounts",
    "BatchSnapshot",
    "Heartbeat",
    "ReplicaReport",
    "ServeMetrics",
    "TextCounts",
    "TextSnapshot",
]
