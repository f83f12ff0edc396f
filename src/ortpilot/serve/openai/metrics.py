"""``/metrics`` of the decoder server: requests at its ingress, and every decoder replica's engine summed.

Each decoder replica reports its scheduler's cumulative counters (``Scheduler.counters()``:
requests, tokens in and out, TTFT and inter-token histograms, rows per step, queue depth, the
prefix cache, speculation, steps per weight format) in its heartbeat; the ingress, which every
request passes, counts requests by status itself. At scrape time the newest report of each
replica is added up (counters and histogram buckets sum; the gauges of replicas that stopped
reporting are left out), as the Open Inference Protocol server's metrics do (``metrics``).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
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
class EngineHeartbeat:
    """What a decoder replica sends the ingress across Ray every few seconds: who it is and its engine's
    cumulative counters (``decode.Scheduler.counters``, a document the collectors below read)."""

    model: str
    replica: str
    counters: Mapping[str, Any]

    def to_dict(self) -> dict[str, Any]:
        return {"model": self.model, "replica": self.replica, "counters": dict(self.counters)}

    @classmethod
    def from_dict(cls, doc: Mapping[str, Any]) -> EngineHeartbeat:
        return cls(**dict(doc))


class DecoderMetrics:
    """The ingress's registry: its own request counts and the replicas' engine reports."""

    def __init__(self, models: list[str]) -> None:
        from prometheus_client import CollectorRegistry

        self.models = list(models)
        self.registry = CollectorRegistry(auto_describe=True)
        self.registry.register(_Collector(self))
        self._lock = threading.Lock()
        self._requests: dict[str, RequestCounts] = {}
        self._reports: dict[str, tuple[str, dict[str, Any], float]] = {}  # replica -> (model, counters, seen)

    def observe(self, model: str, code: int, seconds: float) -> None:
        label = model if model in self.models else "(unknown)"
        with self._lock:
            self._requests.setdefault(label, RequestCounts()).observe(code, seconds)

    def report(self, beat: EngineHeartbeat) -> None:
        with self._lock:
            self._reports[beat.replica] = (beat.model, dict(beat.counters), time.monotonic())

    def snapshot(self) -> tuple[dict[str, RequestSnapshot], list[tuple[str, dict[str, Any], bool]]]:
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
            for name, path, _ in COUNTERS:
                counters[name].add_metric([model], sum(_get(c, path) for c, _ in mine))
            for name, path, _ in GAUGES:
                gauges[name].add_metric([model], sum(_get(c, path) for c, alive in mine if alive))
            for name, key, _ in HISTOGRAMS:
                parts = [c.get(key) or {} for c, _ in mine]
                buckets = _sum_buckets(parts)
                histograms[name].add_metric([model], buckets, sum_value=sum(float(p.get("sum", 0)) for p in parts))
            formats: dict[str, float] = {}
            for c, _ in mine:
                for fmt, n in ((c.get("formats") or {}).get("per_format") or {}).items():
                    formats[fmt] = formats.get(fmt, 0) + float((n or {}).get("decode_steps", 0))
            for fmt, n in sorted(formats.items()):
                steps.add_metric([model, fmt], n)
        yield replicas
        yield from counters.values()
        yield from gauges.values()
        yield from histograms.values()
        yield steps


def _sum_buckets(parts: list[Mapping[str, Any]]) -> list[tuple[str, float]]:
    """Cumulative ``[[le, count], ...]`` buckets of several reports (the same bounds) added up."""
    total: dict[str, float] = {}
    order: list[str] = []
    for part in parts:
        for le, n in part.get("buckets") or []:
            key = str(le)
            if key not in total:
                order.append(key)
                total[key] = 0.0
            total[key] += float(n)
    if not order:
        return [("+Inf", 0.0)]
    return [(key, total[key]) for key in order]


__all__ = ["COUNTERS", "GAUGES", "HISTOGRAMS", "DecoderMetrics"]
