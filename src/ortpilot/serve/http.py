"""The HTTP pieces every deployment that answers requests shares: a reply, a route table and its
dispatch, bodies read with a limit and a deadline, the access-log line, internal errors logged once.

The OIP stack builds its route tables from these (``oip.routes``); both stacks answer through the
request pipeline (``pipeline``), which turns a ``Reply`` into the Starlette response.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
import sys
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, replace
from typing import Any

from ortpilot.serve.context import DeadlineExceeded, RequestContext
from ortpilot.serve.errorbody import oip_error


@dataclass
class Reply:
    """What a handler returns: status, body, content type, extra headers, and the model it concerned;
    ``stream`` (instead of ``body``) is a streamed answer's chunks (server-sent events)."""

    status: int
    body: bytes
    content_type: str = "application/json"
    headers: dict[str, str] | None = None
    model: str | None = None  # set for requests that count in ortpilot_requests_total
    stream: AsyncIterator[bytes] | None = None


def json_reply(status: int, doc: Any, model: str | None = None) -> Reply:
    return Reply(status, json.dumps(doc, separators=(",", ":")).encode(), model=model)


def error_reply(status: int, message: str, model: str | None = None) -> Reply:
    """The protocol's error shape: ``{"error": "..."}``."""
    return json_reply(status, oip_error(message), model)


Handler = Callable[..., Awaitable[Reply]]  # (request, context, **path fields)


@dataclass(frozen=True)
class Route:
    method: str
    pattern: re.Pattern
    handler: Handler


def route(method: str, path: str, handler: Handler) -> Route:
    """``/v2/models/{name}/infer`` -> a route whose handler gets ``name=`` from the path."""
    parts = re.split(r"\{(\w+)\}", path)  # literal, name, literal, name, ...
    regex = "".join(re.escape(part) if i % 2 == 0 else f"(?P<{part}>[^/]+)" for i, part in enumerate(parts))
    return Route(method, re.compile(f"^{regex}$"), handler)


log = logging.getLogger("ortpilot.serve")


def find_route(routes: list[Route], method: str, path: str) -> tuple[tuple[Route, dict[str, str]] | None, list[str]]:
    """The route that takes ``method`` on ``path`` with the path's fields, or None and the methods the path
    takes (none: no route has the path)."""
    allowed = []
    for r in routes:
        match = r.pattern.match(path)
        if match is None:
            continue
        if r.method != method:
            allowed.append(r.method)
            continue
        return (r, match.groupdict()), allowed
    return None, allowed


async def dispatch(routes: list[Route], request: Any, context: RequestContext, path: str | None = None) -> Reply:
    """The reply of the route matching ``request`` (405 naming the methods a path takes, 404 for no
    route); its handler gets the request, its ``context`` and the path's fields. A handler that raises is
    a 500 with the request id, logged once with its traceback: the client sees the id, never the exception
    (``DeadlineExceeded`` goes on to the pipeline: a 504)."""
    path = path if path is not None else (request.url.path.rstrip("/") or "/")
    found, allowed = find_route(routes, request.method, path)
    if found is not None:
        route, fields = found
        try:
            return await route.handler(request, context, **fields)
        except DeadlineExceeded:
            raise
        except Exception as exc:
            return error_reply(500, internal_error(f"{request.method} {path}", exc, context.request_id))
    if allowed:
        method = printable(request.method, 20)
        reply = error_reply(405, f"{method} is not allowed on {printable(path)} (use {', '.join(allowed)})")
        return replace(reply, headers={"Allow": ", ".join(allowed)})  # RFC 9110: a 405 says what the path takes
    return error_reply(404, f"no route {printable(request.method, 20)} {printable(path)}")


class BodyError(Exception):
    """A request body the server does not take: over the size limit (413) or too slow to arrive (408)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


async def read_body(request: Any, limit: int, timeout_s: float) -> bytes:
    """The body of ``request``, read with a size limit (checked before reading when the client sends
    Content-Length, and while reading) and a deadline: BodyError 413 / 408 otherwise."""
    declared = request.headers.get("content-length")
    if declared and declared.isascii() and declared.isdigit() and int(declared) > limit:
        raise BodyError(
            413, f"request body of {int(declared)} bytes is over the limit of {limit} bytes (--max-request-mb)"
        )

    async def read() -> bytes:
        chunks, size = [], 0
        async for chunk in request.stream():
            chunks.append(chunk)
            size += len(chunk)
            if size > limit:
                raise BodyError(413, f"request body is over the limit of {limit} bytes (--max-request-mb)")
        return b"".join(chunks)

    try:
        return await asyncio.wait_for(read(), timeout_s)
    except asyncio.TimeoutError:
        raise BodyError(
            408, f"The request body took longer than {timeout_s:g} s (the request timeout); send it faster."
        ) from None


def replica_gone(exc: BaseException) -> bool:
    """Whether a Serve handle call failed because its replica died or went away (not because of the request):
    such a call may run again on another replica. A ``CancelledError`` while this task was not itself
    cancelled is the handle's response cancelled under it, which is how a call in flight on a killed
    replica can end (a relayed gRPC call otherwise reached its client as CANCELLED, RST_STREAM)."""
    if isinstance(exc, asyncio.CancelledError):
        task = asyncio.current_task()
        return task is not None and not task.cancelling()
    if type(exc).__name__ in ("ReplicaUnavailableError", "DeploymentUnavailableError"):
        return True
    try:
        from ray.exceptions import RayActorError
    except ImportError:
        return False
    return isinstance(exc, RayActorError)


def replica_logging() -> None:
    """ortpilot's warnings and errors in a replica go to the process's own stderr, which Ray forwards to the
    driver (a throughput-optimized replica points sys.stderr at Serve's buffered file logger instead)."""
    root = logging.getLogger("ortpilot")
    if not any(getattr(h, "_ortpilot_replica", False) for h in root.handlers):
        handler = logging.StreamHandler(sys.__stderr__ or sys.stderr)
        handler.setFormatter(logging.Formatter("%(levelname)s %(name)s: %(message)s"))
        handler.setLevel(logging.WARNING)
        handler._ortpilot_replica = True  # type: ignore[attr-defined]
        root.addHandler(handler)


def internal_error(what: str, exc: BaseException | None = None, ident: str | None = None) -> str:
    """Log a server-side failure once, with its traceback and the request's id (``ident``; a new one without
    it); returns the one line the client gets instead (the id, never the exception)."""
    ident = ident or uuid.uuid4().hex[:12]
    log.error("request %s failed (request id %s)", printable(what), printable(ident, 130), exc_info=exc)
    return f"internal error (request id {ident}); the server log has its details"


def with_headers(reply: Reply, headers: dict[str, str]) -> Reply:
    """``reply`` with ``headers`` added (CORS headers on every answer to an allowed origin)."""
    if headers:
        reply.headers = {**(reply.headers or {}), **headers}
    return reply


def printable(text: str, limit: int = 200) -> str:
    """``text`` safe for a terminal and a log line: control characters and non-ASCII escaped, cut to ``limit``."""
    escaped = text.encode("unicode_escape", "backslashreplace").decode("ascii").replace('"', "%22")
    return escaped if len(escaped) <= limit else escaped[: limit - 3] + "..."


def log_request(request: Any, status: int, size: int | str, started: float) -> None:
    """The access-log line of ``request`` (``size``: response bytes, or "-" for a stream), escaped."""
    client = request.client.host if request.client else "-"
    access_line(printable(client), request.method, request.url.path, status, size, started)


def access_line(client: str, method: str, target: str, status: int, size: int | str, started: float) -> None:
    """One access-log line (HTTP requests and gRPC calls alike): ``client "METHOD TARGET" status size time``."""
    # The process's own stderr, which Ray forwards to the driver: a throughput-optimized replica points
    # sys.stderr at Serve's buffered file logger instead.
    stream = sys.__stderr__ or sys.stderr
    stream.write(
        f'{client} "{printable(method, 20)} {printable(target)}" {status} {size} '
        f"{(time.perf_counter() - started) * 1000:.1f}ms\n"
    )
    stream.flush()


def response(reply: Reply) -> Any:
    """The Starlette response of ``reply`` (a ``StreamingResponse`` for a streamed one)."""
    from starlette.responses import Response, StreamingResponse

    if reply.stream is not None:
        return StreamingResponse(
            reply.stream, status_code=reply.status, media_type=reply.content_type, headers=reply.headers
        )
    return Response(reply.body, status_code=reply.status, media_type=reply.content_type, headers=reply.headers)


__all__ = [
    "BodyError",
    "Handler",
    "Reply",
    "Route",
    "access_line",
    "dispatch",
    "error_reply",
    "find_route",
    "internal_error",
    "json_reply",
    "log_request",
    "printable",
    "read_body",
    "replica_gone",
    "replica_logging",
    "response",
    "route",
    "with_headers",
]
