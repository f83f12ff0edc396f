"""``/metrics`` of the decoder server: requests at its ingress, and every decoder replica's engine summed.

Each decoder replica reports its scheduler's cumulative counters (``Scheduler.counters()``:
requests, tokens in and out, TTFT and inter-token histograms, rows per step, queue depth, the
prefix cache, speculation, steps per weight format) in its heartbeat, as an ``EngineCounters``
record read in the replica; the ingress, which every
request passes, counts requests by status itself. At scrape time the newest report of each
replica is added up (counters and histogram buckets sum; the gauges of replicas that stopped
reporting are left out), as the Open Inference Protocol server's metrics do (``metrics``).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from ortpilot.serve.counts import REPLICA_TTL_S, SECONDS_BUCKETS, RequestCounts, RequestSnapshot, cumulative

# Counters a report holds at its top level or one level down: (family suffix, path, help).
COUNTERS = (
    ("requests", ("requests",), "Requests the engine admitted."),
    ("rejected", ("rejected",), "Requests refused with 429 (queue full)."),
    ("prompt_tokens", ("prompt_tokens",), "Prompt tokens of admitted requests."),
    ("prefill_tokens", ("prefill_tokens",), "Prompt tokens prefilled (the rest came from the prefix cache)."),
    ("completion_tokens", ("completion_tokens",), "Tokens generated."),
    ("decode_steps", ("decode_steps",), "Batched decode steps run."),
    ("prefix_cache_hits", ("prefix_cache", "hits"), "Requests whose prompt began with cached blocks."),
    ("prefix_cache_misses", ("prefix_cache", "misses"), "Requests with no cached prefix."),
    ("prefix_cache_hit_tokens", ("prefix_cache", "hit_tokens"), "Prompt tokens served from the prefix cache."),
    ("prefix_cache_evictions", ("prefix_cache", "evictions"), "Blocks evicted from the prefix cache (LRU)."),
    ("speculation_drafted", ("speculation", "drafted"), "Tokens drafted by prompt lookup."),
    ("speculation_accepted", ("speculation", "accepted"), "Drafted tokens the model's greedy run accepted."),
    ("speculation_verify_runs", ("speculation", "verify_runs"), "Runs that verified a draft."),
)
GAUGES = (
    ("queue_depth", ("queue_depth",), "Requests waiting for a slot."),
    ("active_streams", ("active",), "Streams decoding."),
    ("prefilling_streams", ("prefilling",), "Streams being prefilled."),
    ("prefix_cache_bytes", ("prefix_cache", "bytes_held"), "Bytes of KV rows the prefix cache holds."),
)
HISTOGRAMS = (
    ("ttft_seconds", "ttft_seconds", "Time to first token, from the request's arrival."),
    ("inter_token_seconds", "inter_token_seconds", "Time between two tokens of a stream."),
    ("rows_per_step", "rows_per_step", "Rows (streams) per decode step."),
)
PREFIX = "ortpilot_decode_"


def _get(doc: Mapping[str, Any], path: tuple[str, ...]) -> float:
    value: Any = doc
    for key in path:
        if not isinstance(value, Mapping):
            return 0.0
        value = value.get(key)
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else 0.0


@dataclass(frozen=True)
class HistogramParts:
    """One engine histogram as ``decode.stats.Histogram.to_dict`` gives it: cumulative ``(le, count)``
    buckets ending with +Inf, and the sum of the observed values."""

    buckets: tuple[tuple[str, float], ...] = ()
    sum: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        return {"buckets": [list(b) for b in self.buckets], "sum": self.sum}

    @classmethod
    def from_dict(cls, doc: Mapping[str, Any]) -> HistogramParts:
        return cls(tuple((str(le), float(n)) for le, n in doc["buckets"]), float(doc["sum"]))


@dataclass(frozen=True)
class EngineCounters:
    """An engine's cumulative counters and gauges as ``/metrics`` reads them (one field per family of
    ``COUNTERS``, ``GAUGES`` and ``HISTOGRAMS``; ``format_steps``: decode steps per weight format).
    Built in the replica from the scheduler's own document (``of_engine``)."""

    requests: float = 0.0
    rejected: float = 0.0
    prompt_tokens: float = 0.0
    prefill_tokens: float = 0.0
    completion_tokens: float = 0.0
    decode_steps: float = 0.0
    prefix_cache_hits: float = 0.0
    prefix_cache_misses: float = 0.0
    prefix_cache_hit_tokens: float = 0.0
    prefix_cache_evictions: float = 0.0
    speculation_drafted: float = 0.0
    speculation_accepted: float = 0.0
    speculation_verify_runs: float = 0.0
    queue_depth: float = 0.0
    active_streams: float = 0.0
    prefilling_streams: float = 0.0
    prefix_cache_bytes: float = 0.0
    ttft_seconds: HistogramParts = field(default_factory=HistogramParts)
    inter_token_seconds: HistogramParts = field(default_factory=HistogramParts)
    rows_per_step: HistogramParts = field(default_factory=HistogramParts)
    format_steps: Mapping[str, float] = field(default_factory=dict)

    @classmethod
    def of_engine(cls, doc: Mapping[str, Any]) -> EngineCounters:
        """The counters of ``decode.Scheduler.counters()`` (docs/concepts/decode-engine.md lists its fields);
        a field it lacks (no prefix cache, no speculation) is 0."""
        values = {name: _get(doc, path) for name, path, _ in (*COUNTERS, *GAUGES)}
        histograms = {
            name: HistogramParts.from_dict(doc.get(key) or {"buckets": [], "sum": 0}) for name, key, _ in HISTOGRAMS
        }
        per_format = (doc.get("formats") or {}).get("per_format") or {}
        steps = {fmt: float((n or {}).get("decode_steps", 0)) for fmt, n in per_format.items()}
        return cls(**values, **histograms, format_steps=steps)

    def to_dict(self) -> dict[str, Any]:
        histograms = {name: getattr(self, name).to_dict() for name, _, _ in HISTOGRAMS}
        return {**asdict(self), **histograms, "format_steps": dict(self.format_steps)}

    @classmethod
    def from_dict(cls, doc: Mapping[str, Any]) -> EngineCounters:
        histograms = {name: HistogramParts.from_dict(doc[name]) for name, _, _ in HISTOGRAMS}
        return cls(**{**dict(doc), **histograms})


@dataclass(frozen=True)
class EngineHeartbeat:
    """What a decoder replica sends the ingress across Ray every few seconds: who it is and its engine's
    cumulative counters."""

    model: str
    replica: str
    counters: EngineCounters

    def to_dict(self) -> dict[str, Any]:
        return {"model": self.model, "replica": self.replica, "counters": self.counters.to_dict()}

    @classmethod
    def from_dict(cls, doc: Mapping[str, Any]) -> EngineHeartbeat:
        return cls(str(doc["model"]), str(doc["replica"]), EngineCounters.from_dict(doc["counters"]))


class DecoderMetrics:
    """The ingress's registry: its own request counts and the replicas' engine reports."""

    def __init__(self, models: list[str]) -> None:
        from prometheus_client import CollectorRegistry

        self.models = list(models)
        self.registry = CollectorRegistry(auto_describe=True)
        self.registry.register(_Collector(self))
        self._lock = threading.Lock()
        self._requests: dict[str, RequestCounts] = {}
        self._reports: dict[str, tuple[str, EngineCounters, float]] = {}  # replica -> (model, counters, seen)

    def observe(self, model: str, code: int, seconds: float) -> None:
        label = model if model in self.models else "(unknown)"
        with self._lock:
            self._requests.setdefault(label, RequestCounts()).observe(code, seconds)

    def report(self, beat: EngineHeartbeat) -> None:
        with self._lock:
            self._reports[beat.replica] = (beat.model, beat.counters, time.monotonic())

    def snapshot(self) -> tuple[dict[str, RequestSnapshot], list[tuple[str, EngineCounters, bool]]]:
        with self._lock:
            requests = {k: v.snapshot() for k, v in self._requests.items()}
            now = time.monotonic()
            reports = [(m, c, now - seen <= REPLICA_TTL_S) for m, c, seen in self._reports.values()]
        return requests, reports

    def render(self) -> tuple[bytes, str]:
        from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

        return generate_latest(self.registry), CONTENT_TYPE_LATEST


class _Collector:
    def __init__(self, metrics: DecoderMetrics) -> None:
        self.metrics = metrics

    def describe(self) -> list:
        return []

    def collect(self) -> Iterator[Any]:
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily

        requests, reports = self.metrics.snapshot()
        by_code = CounterMetricFamily(
            "ortpilot_requests", "Requests at the ingress by model and HTTP status code.", labels=["model", "code"]
        )
        seconds = HistogramMetricFamily("ortpilot_request_seconds", "Request time at the ingress.", labels=["model"])
        for model, counts in sorted(requests.items()):
            for code, n in sorted(counts.codes.items()):
                by_code.add_metric([model, code], n)
            seconds.add_metric([model], cumulative([counts], SECONDS_BUCKETS), sum_value=counts.sum)
        yield by_code
        yield seconds
        counters = {n: CounterMetricFamily(PREFIX + n, h, labels=["model"]) for n, _, h in COUNTERS}
        gauges = {n: GaugeMetricFamily(PREFIX + n, h, labels=["model"]) for n, _, h in GAUGES}
        histograms = {n: HistogramMetricFamily(PREFIX + n, h, labels=["model"]) for n, _, h in HISTOGRAMS}
        steps = CounterMetricFamily(
            PREFIX + "format_steps", "Decode steps per weight format.", labels=["model", "format"]
        )
        replicas = GaugeMetricFamily(PREFIX + "replicas", "Decoder replicas reporting.", labels=["model"])
        for model in self.metrics.models:
            mine = [(c, alive) for m, c, alive in reports if m == model]
            replicas.add_metric([model], sum(alive for _, alive in mine))
            for name, _, _ in COUNTERS:
                counters[name].add_metric([model], sum(getattr(c, name) for c, _ in mine))
            for name, _, _ in GAUGES:
                gauges[name].add_metric([model], sum(getattr(c, name) for c, alive in mine if alive))
            for name, _, _ in HISTOGRAMS:
                parts = [getattr(c, name) for c, _ in mine]
                histograms[name].add_metric([model], _sum_buckets(parts), sum_value=sum(p.sum for p in parts))
            formats: dict[str, float] = {}
            for c, _ in mine:
                for fmt, n in c.format_steps.items():
                    formats[fmt] = formats.get(fmt, 0) + n
            for fmt, n in sorted(formats.items()):
                steps.add_metric([model, fmt], n)
        yield replicas
        yield from counters.values()
        yield from gauges.values()
        yield from histograms.values()
        yield steps


def _sum_buckets(parts: list[HistogramParts]) -> list[tuple[str, float]]:
    """Cumulative ``(le, count)`` buckets of several reports (the same bounds) added up."""
    total: dict[str, float] = {}
    order: list[str] = []
    for part in parts:
        for key, n in part.buckets:
            if key not in total:
                order.append(key)
                total[key] = 0.0
            total[key] += n
    if not order:
        return [("+Inf", 0.0)]
    return [(key, total[key]) for key in order]


__all__ = ["COUNTERS", "GAUGES", "HISTOGRAMS", "DecoderMetrics", "EngineCounters", "EngineHeartbeat", "HistogramParts"]
