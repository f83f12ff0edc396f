"""The records every entry point (a model replica, the server-wide application, the OpenAI ingress)
receives across the Ray boundary: frozen, typed, with ``to_dict``/``from_dict`` for the places that
need plain data (a Serve config's ``args``, JSON), so no setting travels as an untyped dict that a
replica reads back with a default of its own.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from ortpilot.serve.defaults import (
    DEFAULT_HEADER_TIMEOUT_S,
    DEFAULT_IDLE_TIMEOUT_S,
    DEFAULT_MAX_REQUEST_MB,
    DEFAULT_REQUEST_TIMEOUT_S,
    megabytes,
)


@dataclass(frozen=True)
class Timeouts:
    """How long a client may take, in seconds: headers, the whole request, an idle keep-alive."""

    header_s: int = DEFAULT_HEADER_TIMEOUT_S
    request_s: int = DEFAULT_REQUEST_TIMEOUT_S
    idle_s: int = DEFAULT_IDLE_TIMEOUT_S

    def __post_init__(self) -> None:
        for name, value in asdict(self).items():
            if value < 1:
                raise ValueError(f"{name} must be at least 1 second, got {value}")

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, doc: Mapping[str, Any] | None) -> Timeouts:
        return cls(**dict(doc or {}))


@dataclass(frozen=True)
class AccessPolicy:
    """What a deployment needs to check a request (``access.AccessOptions.policy``): key digests, never
    keys; ``hosts`` None answers any Host (a server on a public address without ``--allowed-host``)."""

    auth: bool = False
    digests: tuple[str, ...] = field(default=(), repr=False)
    key_file: str | None = None
    auth_health: bool = False
    cors_origins: tuple[str, ...] = ()
    hosts: tuple[str, ...] | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "digests", tuple(self.digests))
        object.__setattr__(self, "cors_origins", tuple(self.cors_origins))
        if self.hosts is not None:
            object.__setattr__(self, "hosts", tuple(self.hosts))

    def to_dict(self) -> dict[str, Any]:
        doc = asdict(self)
        doc.update(digests=list(self.digests), cors_origins=list(self.cors_origins))
        doc["hosts"] = None if self.hosts is None else list(self.hosts)
        return doc

    @classmethod
    def from_dict(cls, doc: Mapping[str, Any] | None) -> AccessPolicy:
        return cls(**dict(doc or {}))


@dataclass(frozen=True)
class RequestSettings:
    """How every entry point takes a request: who may call (``access``), the body limit, the request
    timeout, the access log, and whether clients see replicas' PIDs, hosts and paths."""

    access: AccessPolicy = field(default_factory=AccessPolicy)
    max_request_mb: float = DEFAULT_MAX_REQUEST_MB
    request_timeout_s: float = DEFAULT_REQUEST_TIMEOUT_S
    access_log: bool = True
    debug_info: bool = False

    @property
    def max_request_bytes(self) -> int:
        return megabytes(self.max_request_mb)

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "access": self.access.to_dict()}

    @classmethod
    def from_dict(cls, doc: Mapping[str, Any] | None) -> RequestSettings:
        doc = dict(doc or {})
        return cls(**{**doc, "access": AccessPolicy.from_dict(doc.get("access"))})


__all__ = ["AccessPolicy", "RequestSettings", "Timeouts"]
