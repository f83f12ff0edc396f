"""The one path every HTTP request takes into a server, whichever stack answers it: access guard
(Host, Origin, API key) -> route -> error mapping -> CORS headers -> metrics count -> access-log line.

A model replica and the server-wide application (Open Inference Protocol) and the OpenAI ingress each
build one ``Pipeline`` from the ``RequestSettings`` they were sent and an ``ErrorShape`` (how their
protocol words a refusal and a failure), and hand it their router. The order is the rule: a refused
request never reaches a route, every answer to an allowed browser origin carries its CORS headers,
every answer is counted and logged once, and an exception a route raises is a 500 with a request id
in the protocol's own error shape (the log has the traceback, the client never sees it). Plain
code, no Ray: the unit tests drive it with a stand-in request.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from typing import Any, Protocol

from ortpilot.serve.guard import Guard, Verdict
from ortpilot.serve.http import Reply, log_request, response, with_headers
from ortpilot.serve.records import RequestSettings

Observe = Callable[[Any, Reply, float], None]  # (request, reply, seconds): the stack's metrics count


class ErrorShape(Protocol):
    """How one protocol answers a request the guard stopped and a route that failed."""

    def refusal(self, verdict: Verdict, model: str | None) -> Reply: ...

    def failure(self, what: str, exc: Exception) -> Reply: ...


class Pipeline:
    """One entry point's request path (see the module docstring)."""

    def __init__(
        self,
        settings: RequestSettings,
        shape: ErrorShape,
        observe: Observe | None = None,
        refused_model: str | None = None,
    ) -> None:
        self.settings = settings
        self.guard = Guard(settings.access)
        self.shape = shape
        self.observe = observe
        self.refused_model = refused_model  # the model a refused request counts under (None: not counted)

    async def reply(self, request: Any, route: Callable[[], Awaitable[Reply]], *, health: bool = False) -> Reply:
        """The guarded, routed and error-mapped reply to ``request``, with its CORS headers."""
        verdict = self.guard.http(request.method, request.headers, health=health)
        if verdict is not None:
            reply = self.shape.refusal(verdict, self.refused_model if verdict.status != 204 else None)
        else:
            try:
                reply = await route()
            except Exception as exc:  # the protocol's 500, a request id, one log line with the traceback
                reply = self.shape.failure(f"{request.method} {request.url.path}", exc)
        return with_headers(reply, self.guard.cors_headers(request.headers))

    async def handle(self, request: Any, route: Callable[[], Awaitable[Reply]], *, health: bool = False) -> Any:
        """The Starlette response to ``request``: ``reply``, then counted and logged."""
        started = time.perf_counter()
        reply = await self.reply(request, route, health=health)
        if self.observe is not None:
            self.observe(request, reply, time.perf_counter() - started)
        if self.settings.access_log:
            log_request(request, reply.status, "-" if reply.stream is not None else len(reply.body), started)
        return response(reply)


__all__ = ["ErrorShape", "Observe", "Pipeline"]
