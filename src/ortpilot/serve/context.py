"""What the request pipeline knows of one request, handed to every route: its id, its deadline, the
model it is for and the protocol it speaks.

The pipeline (``pipeline``) builds one ``RequestContext`` per request or gRPC call, after the guard let
it through: the id from the client's ``X-Request-Id`` header (or gRPC metadata), or a new one; the
deadline from the request timeout (``--request-timeout``). A route hands it on to what does the work (a
replica's runner, a decoder replica across Ray), so a per-request setting is one field here, read where
it applies. The record is frozen and plain: the deadline is a wall-clock instant (seconds since the
epoch), the same in every process of the cluster.
"""

from __future__ import annotations

import math
import re
import time
import uuid
from collections.abc import Mapping
from dataclasses import asdict, dataclass, replace
from typing import Any

from ortpilot.serve.records import RequestSettings

REQUEST_ID_HEADER = "x-request-id"  # HTTP header (Ray Serve sets one when absent) and gRPC metadata key
_REQUEST_ID = re.compile(r"[!-~]{1,128}")  # visible ASCII: it goes into a header and a log line


class ContextError(Exception):
    """A request whose ``X-Request-Id`` the server cannot take: a 400 naming it."""

    def __init__(self, message: str, header: str) -> None:
        super().__init__(message)
        self.message = message
        self.header = header


@dataclass(frozen=True)
class RequestContext:
    """One request as every route sees it (see the module docstring)."""

    request_id: str
    protocol: str  # errorbody.OIP | errorbody.OPENAI
    deadline: float | None  # seconds since the epoch; None: no deadline (a call outside a server)
    timeout_s: float | None = None  # the time it was given (what its 504 names)
    model: str | None = None  # the model it is for, once known (a replica's own; OpenAI: the body's)

    def remaining_s(self) -> float:
        """Seconds left before the deadline (``inf`` without one; 0 or less once it passed)."""
        return math.inf if self.deadline is None else self.deadline - time.time()

    @property
    def expired(self) -> bool:
        return self.remaining_s() <= 0

    def for_model(self, model: str) -> RequestContext:
        """This context once the route knows the model the request is for."""
        return replace(self, model=model)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, doc: Mapping[str, Any]) -> RequestContext:
        return cls(**dict(doc))


def new_request_id() -> str:
    return uuid.uuid4().hex[:16]


def request_context(
    headers: Mapping[str, str],
    settings: RequestSettings,
    protocol: str,
    model: str | None = None,
    now: float | None = None,
) -> RequestContext:
    """The context of a request with ``headers`` (lower-case names: Starlette's headers, gRPC metadata) on
    an entry point with ``settings``; raises ``ContextError`` for an id it cannot take."""
    ident = headers.get(REQUEST_ID_HEADER)
    if ident is None:
        ident = new_request_id()
    elif not _REQUEST_ID.fullmatch(ident):
        raise ContextError(
            f"{REQUEST_ID_HEADER.title()} {ident[:60]!a} is not a request id this server takes: "
            "1 to 128 visible ASCII characters, no spaces (or leave it out and the server makes one).",
            REQUEST_ID_HEADER,
        )
    timeout = float(settings.request_timeout_s)
    start = time.time() if now is None else now
    return RequestContext(ident, protocol, start + timeout, timeout, model)


def metadata(context: Any) -> dict[str, str]:
    """A gRPC call's invocation metadata as lower-case names and text values ({} for a call through a
    Serve handle, which has no context)."""
    if context is None:
        return {}
    found: dict[str, str] = {}
    for key, value in context.invocation_metadata() or ():
        found.setdefault(key.lower(), value if isinstance(value, str) else value.decode(errors="replace"))
    return found


__all__ = [
    "REQUEST_ID_HEADER",
    "ContextError",
    "RequestContext",
    "metadata",
    "new_request_id",
    "request_context",
]
