"""What the request pipeline knows of one request, handed to every route: its id, its deadline, the
model it is for and the protocol it speaks.

The pipeline (``pipeline``) builds one ``RequestContext`` per request or gRPC call, after the guard let
it through: the id from the client's ``X-Request-Id`` header (or gRPC metadata), or a new one; the
deadline from the request timeout (``--request-timeout``), shortened by the client's
``X-Request-Timeout: SECONDS`` (never lengthened: the server's timeout is the most a request gets). A
route hands it on to what does the work (a replica's runner and batcher, a decoder replica across Ray),
so a per-request setting is one field here, read where it applies. The record is frozen and plain: the
deadline is a wall-clock instant (seconds since the epoch), the same in every process of the cluster.

A request still waiting at its deadline is not run; one whose answer does not come in time gets 504 in
its protocol's error shape (``DeadlineExceeded``, which the pipeline maps through its ``ErrorShape``).
"""

from __future__ import annotations

import asyncio
import math
import re
import time
import uuid
from collections.abc import Awaitable, Mapping
from dataclasses import asdict, dataclass, replace
from typing import Any, TypeVar

from ortpilot.serve.records import RequestSettings

T = TypeVar("T")
REQUEST_ID_HEADER = "x-request-id"  # HTTP header (Ray Serve sets one when absent) and gRPC metadata key
TIMEOUT_HEADER = "x-request-timeout"  # seconds, at most the server's --request-timeout
_REQUEST_ID = re.compile(r"[!-~]{1,128}")  # visible ASCII: it goes into a header and a log line


class DeadlineExceeded(Exception):
    """A request's deadline passed before its answer: 504 (gRPC DEADLINE_EXCEEDED) in the protocol's shape."""

    def __init__(self, context: RequestContext) -> None:
        super().__init__(context.expired_message())
        self.context = context


class ContextError(Exception):
    """A request whose ``X-Request-Id`` or ``X-Request-Timeout`` the server cannot take: a 400 naming it."""

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

    def expired_message(self) -> str:
        given = f"its deadline of {self.timeout_s:g} s" if self.timeout_s is not None else "its deadline"
        return (
            f"The request did not get its answer within {given} (the server's --request-timeout, or the "
            f"client's {TIMEOUT_HEADER.title()} when shorter); a request still queued then was not run. "
            "Retry later, or allow it more time."
        )

    async def within(self, work: Awaitable[T]) -> T:
        """``work``'s result, or ``DeadlineExceeded`` when the deadline passes first; the work is then
        cancelled (a request queued in a batcher leaves the queue, a relayed call is cancelled)."""
        remaining = self.remaining_s()
        if remaining == math.inf:
            return await work
        if remaining <= 0:
            if asyncio.iscoroutine(work):
                work.close()  # never started: nothing to cancel
            raise DeadlineExceeded(self)
        try:
            return await asyncio.wait_for(work, remaining)
        except asyncio.TimeoutError:
            raise DeadlineExceeded(self) from None

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
    an entry point with ``settings``; raises ``ContextError`` for an id or a timeout it cannot take."""
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
    asked = headers.get(TIMEOUT_HEADER)
    if asked is not None:
        timeout = min(timeout, _seconds(asked, timeout))
    start = time.time() if now is None else now
    return RequestContext(ident, protocol, start + timeout, timeout, model)


def _seconds(text: str, most: float) -> float:
    try:
        value = float(text.strip())
    except ValueError:
        value = math.nan
    if not (value > 0 and math.isfinite(value)):
        raise ContextError(
            f"{TIMEOUT_HEADER.title()} {text[:40]!a} is not a number of seconds above 0; send e.g. "
            f"'{TIMEOUT_HEADER.title()}: 2.5' (at most the server's {most:g} s counts).",
            TIMEOUT_HEADER,
        )
    return value


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
    "TIMEOUT_HEADER",
    "ContextError",
    "DeadlineExceeded",
    "RequestContext",
    "metadata",
    "new_request_id",
    "request_context",
]
