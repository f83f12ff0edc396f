"""What a running server reports once its models are ready: one record per model with its ready line.

The Open Inference Protocol server (``oip.readiness``) and the OpenAI one (``openai.server``) each make their
own kind of record; both have ``line()`` and ``to_dict()``, so the CLI renders either with one
callback (``Served``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ortpilot.eps import CPU_EP


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
            f"{CPU_EP}, {self.url} (OpenAI API; {info['max_streams']} streams of "
            f"{info['max_length']} tokens, queue {info['max_queue']}; cold start {self.cold_start_s:.1f} s)"
        )

    def to_dict(self) -> dict[str, Any]:
        return self.doc


@dataclass
class Served:
    """What a running server reports once every model is ready: one record per model, each with
    ``line()`` (the ready line) and ``to_dict()``; ``url`` is the API's base for decoders; ``path``
    the ingress path requests take (``fastpath.IngressPath``) and ``grpc`` the gRPC address, if any."""

    models: list[Any]
    url: str | None = None
    path: Any = None
    grpc: str | None = None
    # Set once stopped: the local Ray instance this server started stopped under it (a signal to the whole
    # process group, or a second signal), so Ray's state in this process is gone: the process should end now.
    ray_left_behind: bool = False

    def lines(self) -> list[str]:
        return [m.line() for m in self.models] + ([self.path_line()] if self.path is not None else [])

    def path_line(self) -> str:
        """``ingress: HAProxy -> replica (...); gRPC ...; ports ...`` and why any switch is off."""
        parts = [f"ingress: {self.path.describe()}"]
        one_hop = getattr(self.path, "text_one_hop", ())
        if one_hop:
            parts.append(f"/v1 text requests go straight to the replicas of the model they name ({', '.join(one_hop)})")
        if self.grpc:
            parts.append(f"KServe v2 gRPC on {self.grpc}")
        ports = {k: v for k, v in (self.path.ports or {}).items() if k != "run_dir"}
        if ports:
            where = "127.0.0.1" if self.path.loopback else "this host"
            parts.append(f"other ports on {where}: " + ", ".join(f"{k} {v}" for k, v in ports.items()))
        return "; ".join(parts + list(self.path.notes))

    def to_dict(self) -> dict[str, Any]:
        doc: dict[str, Any] = {"url": self.url} if self.url else {}
        if self.path is not None:
            doc["ingress"] = {**self.path.to_dict(), "grpc": self.grpc}
            doc["ingress"]["ports"] = {k: v for k, v in doc["ingress"]["ports"].items() if k != "run_dir"}
        return {**doc, "models": [m.to_dict() for m in self.models]}


__all__ = ["DecoderReady", "ModelReady", "Served"]
