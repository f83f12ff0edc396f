"""What a decoder replica tells the ingress about itself (``DecoderReplica.describe``, shown by
``GET /v1/models/NAME``): typed records, so what crosses Ray is read by field. ``public_dict``
leaves out what only --debug-info shows (the PID, the model's source, other clients' requests).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

PRIVATE_INFO = ("pid", "source", "recent")  # what GET /v1/models/NAME shows only with --debug-info


@dataclass(frozen=True)
class EngineSummary:
    """The engine's settings and totals (``decode.Scheduler.stats``, every field of it)."""

    max_streams: int
    max_queue: int
    max_length: int
    prefill_chunk: int
    decode_steps: int
    rows_decoded: int
    mean_rows_per_step: float
    kv_cache_bytes: int
    pending: int
    formats: tuple[str, ...]
    prefix_cache_bytes: int
    speculation: str

    def __post_init__(self) -> None:
        object.__setattr__(self, "formats", tuple(self.formats))

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "formats": list(self.formats)}

    @classmethod
    def from_dict(cls, doc: Mapping[str, Any]) -> EngineSummary:
        return cls(**dict(doc))  # a field the scheduler adds is refused here, not dropped: add it above


@dataclass(frozen=True)
class StreamRecord:
    """One finished request a replica remembers (``decode.StreamMetrics`` and its id), for --debug-info."""

    id: int
    prompt_tokens: int
    completion_tokens: int
    queue_s: float
    ttft_s: float
    decode_s: float
    ms_per_token: float
    total_s: float
    stop_reason: str
    tokens_after_cancel: int = 0

    @classmethod
    def of(cls, stream: Any) -> StreamRecord:
        """The record of a finished ``decode.Stream``."""
        return cls(id=stream.id, **stream.metrics().to_dict(), tokens_after_cancel=stream.tokens_after_cancel)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, doc: Mapping[str, Any]) -> StreamRecord:
        return cls(**dict(doc))


@dataclass(frozen=True)
class DecoderInfo:
    """One decoder replica: what it loaded, its threads and load time, its engine, its recent requests."""

    name: str
    source: str
    pid: int
    intra_op_threads: int
    load_s: float
    max_positions: int | None
    chat_template: str
    notes: tuple[str, ...]
    engine: EngineSummary
    recent: tuple[StreamRecord, ...] = ()

    def __post_init__(self) -> None:
        object.__setattr__(self, "notes", tuple(self.notes))
        object.__setattr__(self, "recent", tuple(self.recent))

    def to_dict(self) -> dict[str, Any]:
        """The document ``GET /v1/models/NAME`` shows (the engine's fields at its top level)."""
        return {
            "name": self.name,
            "source": self.source,
            "pid": self.pid,
            "intra_op_threads": self.intra_op_threads,
            "load_s": self.load_s,
            "max_positions": self.max_positions,
            "chat_template": self.chat_template,
            "notes": list(self.notes),
            **self.engine.to_dict(),
            "recent": [r.to_dict() for r in self.recent],
        }

    def public_dict(self) -> dict[str, Any]:
        """``to_dict`` without what only --debug-info shows."""
        return {k: v for k, v in self.to_dict().items() if k not in PRIVATE_INFO}

    @classmethod
    def from_dict(cls, doc: Mapping[str, Any]) -> DecoderInfo:
        own = {"name", "source", "pid", "intra_op_threads", "load_s", "max_positions", "chat_template", "notes"}
        return cls(
            **{k: doc[k] for k in own},
            engine=EngineSummary.from_dict({k: v for k, v in doc.items() if k not in own and k != "recent"}),
            recent=tuple(StreamRecord.from_dict(r) for r in doc["recent"]),
        )


__all__ = ["PRIVATE_INFO", "DecoderInfo", "EngineSummary", "StreamRecord"]
