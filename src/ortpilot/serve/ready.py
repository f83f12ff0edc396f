"""What a running server reports once its models are ready: one record per model with its ready line.

The Open Inference Protocol server (``runner``) and the OpenAI one (``openai_app``) each make their
own kind of record; both have ``line()`` and ``to_dict()``, so the CLI renders either with one
callback (``Served``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class ModelReady:
    """One model's ready line: name, live verified replicas, their providers, URL, time from start."""

    name: str
    replicas: int
    providers: list[str]
    url: str
    cold_start_s: float
    notes: list[str] = field(default_factory=list)
    replica_info: list[dict[str, Any]] = field(default_factory=list)

    def line(self) -> str:
        text = (
            f"{self.name}: {self.replicas} replica{'s' if self.replicas != 1 else ''} ready on "
            f"{', '.join(self.providers)}, {self.url} (cold start {self.cold_start_s:.1f} s)"
        )
        return text + "".join(f"; {n}" for n in self.notes)

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "replicas": self.replicas,
            "providers": self.providers,
            "url": self.url,
            "cold_start_s": round(self.cold_start_s, 3),
            "notes": self.notes,
            "replica_info": self.replica_info,
        }


@dataclass
class DecoderReady:
    """One decoder's ready line: its model object (``GET /v1/models/NAME``), replicas, URL, time from start."""

    doc: dict[str, Any]
    replicas: int
    url: str
    cold_start_s: float

    def line(self) -> str:
        info = self.doc["ortpilot"]
        return (
            f"{self.doc['id']}: {self.replicas} replica{'s' if self.replicas != 1 else ''} ready on "
            f"CPUExecutionProvider, {self.url} (OpenAI API; {info['max_streams']} streams of "
            f"{info['max_length']} tokens, queue {info['max_queue']}; cold start {self.cold_start_s:.1f} s)"
        )

    def to_dict(self) -> dict[str, Any]:
        return self.doc


@dataclass
class Served:
    """What a running server reports once every model is ready: one record per model, each with
    ``line()`` (the ready line) and ``to_dict()``; ``url`` is the API's base for decoders."""

    models: list[Any]
    url: str | None = None

    def lines(self) -> list[str]:
        return [m.line() for m in self.models]

    def to_dict(self) -> dict[str, Any]:
        doc: dict[str, Any] = {"url": self.url} if self.url else {}
        return {**doc, "models": [m.to_dict() for m in self.models]}


__all__ = ["DecoderReady", "ModelReady", "Served"]
