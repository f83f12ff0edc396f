"""The one path every request takes into a server, whichever stack answers it: access guard
(Host, Origin, API key) -> request context -> route -> error mapping -> CORS headers -> metrics count
-> access-log line.

A model replica and the server-wide application (Open Inference Protocol) and the OpenAI ingress each
build one ``Pipeline`` from the ``RequestSettings`` they were sent and an ``ErrorShape`` (how their
protocol words a refusal, a failure and a missed deadline), and hand it their router. The order is the
rule: a refused request never reaches a route; every request that passes gets a frozen
``context.RequestContext`` (its id, deadline, model, protocol), which the pipeline hands the route; every
answer to an allowed browser origin carries its CORS headers; every answer is counted and logged once; a
route whose deadline passed (``DeadlineExceeded``) is a 504, and any other exception a route raises a 500
with the request id, both in the protocol's own error shape (the log has the traceback, the client never
sees it). The id is the client's ``X-Request-Id``, or the one Ray Serve's request-id middleware set when
the client sent none; that middleware echoes it on every answer. Plain code, no Ray: the unit tests
drive it with a stand-in request.

A gRPC call takes the same path (``call``): the guard's key check, the message check, its context (from
the call's metadata), the route (an ``RpcReply``, the gRPC form of ``Reply``), the error mapping, the count
and the log line; an ``RpcShape`` (the OIP stack's ``grpc_rpcs.GrpcStatus``) says how gRPC words each answer.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Protocol

from ortpilot.serve.context import (
    ContextError,
    DeadlineExceeded,
    RequestContext,
    metadata,
    request_context,
)
from ortpilot.serve.guard import Guard, Verdict
from ortpilot.serve.http import Reply, access_line, internal_error, log_request, printable, response, with_headers
from ortpilot.serve.records import RequestSettings


@dataclass(frozen=True)
class RpcReply:
    """What a gRPC route answers, the gRPC form of ``Reply``: the response message (None: the RPC's empty
    one), the HTTP-like status the pipeline sets as the call's gRPC code (and counts), its message, and
    the model it concerned. A replica hands one to the server-wide application across Ray, so it is a
    plain frozen record."""

    answer: Any = None
    status: int = 200
    message: str = ""
    model: str | None = None


Observe = Callable[[Any, "Reply | RpcReply", float], None]  # (request, reply, seconds): the stack's metrics count


Route = Callable[[RequestContext], Awaitable[Reply]]  # what answers a request the guard let through
RpcRoute = Callable[[RequestContext], Awaitable[RpcReply]]


class ErrorShape(Protocol):
    """How one protocol answers a request the guard stopped, a route that failed and a missed deadline."""

    protocol: str  # errorbody.OIP | errorbody.OPENAI: the contexts' protocol

    def refusal(self, verdict: Verdict, model: str | None) -> Reply: ...

    def failure(self, what: str, exc: Exception, context: RequestContext) -> Reply: ...

    def expired(self, context: RequestContext) -> Reply: ...


class RpcShape(Protocol):
    """How gRPC words the pipeline's answers: the message check, the call's status, an empty response."""

    def invalid(self, request: Any) -> str | None: ...  # why the call's message is not one (None: it is)

    def set_status(self, context: Any, status: int, message: str) -> None: ...

    def empty(self, rpc: str) -> Any: ...


class Pipeline:
    """One entry point's request path (see the module docstring)."""

    def __init__(
        self,
        settings: RequestSettings,
        shape: ErrorShape,
        observe: Observe | None = None,
        refused_model: str | None = None,
        rpc: RpcShape | None = None,
        model: str | None = None,
    ) -> None:
        self.settings = settings
        self.guard = Guard(settings.access)
        self.shape = shape
        self.observe = observe
        self.refused_model = refused_model  # the model a refused request counts under (None: not counted)
        self.rpc = rpc  # how gRPC calls are answered (None: this entry point takes none)
        self.model = model  # the model every request here is for (a replica's); None: the route learns it

    def context(self, headers: Any) -> RequestContext:
        """The context of a request with ``headers`` (``ContextError`` for an id or a timeout it cannot take)."""
        return request_context(headers, self.settings, self.shape.protocol, self.model)

    async def reply(
        self, request: Any, route: Route, *, health: bool = False, shape: ErrorShape | None = None
    ) -> Reply:
        """The guarded, routed and error-mapped reply to ``request``, with its CORS headers. ``shape``: the
        error shape of this request's protocol where it is not the entry point's (a text model's OpenAI
        routes on an Open Inference Protocol replica), whose context names that protocol."""
        shape = shape or self.shape
        verdict = self.guard.http(request.method, request.headers, health=health)
        if verdict is not None:
            reply = shape.refusal(verdict, self.refused_model if verdict.status != 204 else None)
        else:
            try:
                context = request_context(request.headers, self.settings, shape.protocol, self.model)
            except ContextError as exc:
                reply = shape.refusal(Verdict(400, exc.message, "invalid_header"), self.refused_model)
            else:
                reply = await self._route(f"{request.method} {request.url.path}", route, context, shape)
        return with_headers(reply, self.guard.cors_headers(request.headers))

    async def _route(self, what: str, route: Route, context: RequestContext, shape: ErrorShape) -> Reply:
        try:
            return await route(context)
        except DeadlineExceeded as exc:  # the protocol's 504
            return shape.expired(exc.context)
        except Exception as exc:  # the protocol's 500, the request id, one log line with the traceback
            return shape.failure(what, exc, context)

    async def handle(self, request: Any, route: Route, *, health: bool = False, shape: ErrorShape | None = None) -> Any:
        """The Starlette response to ``request``: ``reply``, then counted and logged."""
        started = time.perf_counter()
        reply = await self.reply(request, route, health=health, shape=shape)
        if self.observe is not None:
            self.observe(request, reply, time.perf_counter() - started)
        if self.settings.access_log:
            log_request(request, reply.status, "-" if reply.stream is not None else len(reply.body), started)
        return response(reply)

    async def rpc_reply(
        self, rpc: str, request: Any, context: Any, route: RpcRoute, *, health: bool = False
    ) -> RpcReply:
        """The guarded, checked and error-mapped answer to gRPC call ``rpc``: a refused call (its key), a
        message that does not parse or metadata the context cannot take (400) never reaches ``route``; they
        count under ``refused_model``. ``context`` is gRPC's (``grpc_context``); the route gets the request's."""
        assert self.rpc is not None, "this pipeline answers no gRPC calls"
        verdict = self.guard.grpc(context, health)
        if verdict is not None:
            return RpcReply(None, verdict.status, verdict.message, self.refused_model)
        invalid = self.rpc.invalid(request)
        if invalid is not None:
            return RpcReply(None, 400, invalid, self.refused_model)
        try:
            call = self.context(metadata(context))
        except ContextError as exc:
            return RpcReply(None, 400, exc.message, self.refused_model)
        try:
            return await route(call)
        except DeadlineExceeded as exc:  # DEADLINE_EXCEEDED
            return RpcReply(None, 504, str(exc), call.model)
        except Exception as exc:  # INTERNAL, the request id, one log line with the traceback
            return RpcReply(None, 500, internal_error(f"gRPC {rpc}", exc, call.request_id))

    async def call(self, rpc: str, request: Any, context: Any, route: RpcRoute, *, health: bool = False) -> Any:
        """The response message of gRPC call ``rpc``: ``rpc_reply``, its status set on ``context``, then
        counted and logged (the log line has the HTTP-like status the metrics count, no size)."""
        assert self.rpc is not None, "this pipeline answers no gRPC calls"
        started = time.perf_counter()
        reply = await self.rpc_reply(rpc, request, context, route, health=health)
        self.rpc.set_status(context, reply.status, reply.message)
        if self.observe is not None:
            self.observe(request, reply, time.perf_counter() - started)
        if self.settings.access_log:
            access_line(_peer(context), "gRPC", rpc, reply.status, "-", started)
        return reply.answer if reply.answer is not None else self.rpc.empty(rpc)


def _peer(context: Any) -> str:
    """The caller of a gRPC call as gRPC names it (``ipv4:127.0.0.1:50000``), "-" when unknown (a call
    through a Serve handle has no context)."""
    try:
        return printable(str(context.peer() or "-"), 80)
    except Exception:
        return "-"


__all__ = ["ErrorShape", "Observe", "Pipeline", "Route", "RpcReply", "RpcRoute", "RpcShape"]
