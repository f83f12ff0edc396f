"""The OpenAI-compatible ingress: ``/v1`` (models, completions, chat completions), ``/metrics`` and the
health probes, in front of one deployment per decoder.

The ingress parses and checks a request (400 for bad input, 404 for an unknown model) through the
request pipeline (``serve.pipeline``: guard, context, route, errors in OpenAI's shape, CORS, count,
access log) and hands a generation with its ``RequestContext`` to ``relay``, which calls a decoder
replica and shapes its answer before the deadline. Ray is imported only inside the functions here.
"""

from __future__ import annotations

from typing import Any

from ortpilot.serve import loopback
from ortpilot.serve.context import RequestContext
from ortpilot.serve.defaults import HEALTH_PATHS, LIVE_PATH
from ortpilot.serve.http import Reply, replica_gone
from ortpilot.serve.openai.metrics import DecoderMetrics, EngineHeartbeat
from ortpilot.serve.openai.relay import Relay, unavailable
from ortpilot.serve.openai.wire import (
    ROUTE_PREFIX,
    ApiError,
    json_answer,
    model_object,
    not_found,
    now,
    parse_request,
)
from ortpilot.serve.openaiapi import OpenAIErrors
from ortpilot.serve.pipeline import Pipeline
from ortpilot.serve.records import RequestSettings

SERVER_PATHS = ("/metrics", *HEALTH_PATHS)


class OpenAIIngress:
    """``GET /v1/models``, ``GET /v1/models/{name}``, ``POST /v1/completions``, ``POST /v1/chat/completions``.

    Every request passes the guard (Host, Origin, API key) first; bodies are read with the size limit and
    the request timeout; an unexpected failure is a 500 in OpenAI's shape with a request id (logged once);
    a replica that dies before a request's first token is replaced by another replica's run (a stream that
    already sent tokens ends with an error event). After ``drain`` new requests get 503 with Retry-After."""

    def __init__(self, handles: dict[str, Any], settings: RequestSettings | None = None) -> None:
        from ortpilot.serve.http import replica_logging

        replica_logging()
        loopback.install()  # before Ray binds this replica's gRPC server (after the constructor)
        self.settings = settings or RequestSettings()
        self.handles = dict(handles)
        self.created = now()
        self.pipeline = Pipeline(self.settings, OpenAIErrors(), self._observe)
        self.guard = self.pipeline.guard
        self.debug_info = self.settings.debug_info
        self.draining = False
        self.in_flight = 0  # requests being answered, streams included (drain waits for none)
        self.metrics = DecoderMetrics(list(self.handles))
        self.relay = Relay(self.handles)

    async def report(self, beat: EngineHeartbeat) -> None:
        """A decoder replica's heartbeat: its engine's cumulative counters."""
        self.metrics.report(beat)

    async def __call__(self, request: Any) -> Any:
        full = request.url.path.rstrip("/") or "/"
        self.in_flight += 1
        response = None
        try:
            response = await self.pipeline.handle(
                request, lambda context: self._answer(request, full, context), health=full in HEALTH_PATHS
            )
            return response
        finally:
            if type(response).__name__ != "StreamingResponse":  # a stream counts until it ends (``on_stream_end``)
                self.in_flight -= 1

    async def _answer(self, request: Any, full: str, context: RequestContext) -> Reply:
        """The route's reply once the guard let the request through (503 while draining)."""
        if self.draining:
            raise ApiError(
                503,
                "The server is shutting down; retry (another server, or this one once it is back).",
                kind="server_error",
                code="unavailable",
                retry_after_s=1,
            )
        if full in SERVER_PATHS:
            return self._server_route(request.method, full)
        path = full.removeprefix(ROUTE_PREFIX) if full.startswith(ROUTE_PREFIX + "/") else ""  # "": not the API's
        return await self._route(request.method, path, request, context)

    def _observe(self, request: Any, reply: Reply, seconds: float) -> None:
        """The pipeline's count: requests that named a model, under it (or "(unknown)")."""
        model = getattr(request.state, "model", None)
        if model is not None:
            self.metrics.observe(model, reply.status, seconds)

    def _server_route(self, method: str, path: str) -> Reply:
        """``/metrics`` and the health probes: what this server says of itself."""
        if method != "GET":
            raise ApiError(405, f"{method} is not allowed on {path} (use GET).", code="method_not_allowed")
        if path == "/metrics":
            body, content_type = self.metrics.render()
            return Reply(200, body, content_type)
        if path == LIVE_PATH:
            return json_answer(200, {"live": True})
        _, reports = self.metrics.snapshot()
        states = {name: any(m == name and alive for m, _, alive in reports) for name in self.handles}
        ok = all(states.values()) and not self.draining
        return json_answer(200 if ok else 503, {"ready": ok, "models": states})

    def _stream_ended(self) -> None:
        self.in_flight -= 1

    async def drain(self) -> None:
        """SIGTERM: new requests get 503 + Retry-After; those in flight finish."""
        self.draining = True

    async def pending(self) -> int:
        return self.in_flight

    async def _body(self, request: Any) -> bytes:
        from ortpilot.serve.http import BodyError, read_body

        try:
            return await read_body(request, self.settings.max_request_bytes, self.settings.request_timeout_s)
        except BodyError as exc:
            code = "request_too_large" if exc.status == 413 else "request_timeout"
            raise ApiError(exc.status, exc.message, code=code) from None

    async def _route(self, method: str, path: str, request: Any, context: RequestContext) -> Reply:
        kind = {"/completions": "completion", "/chat/completions": "chat"}.get(path)
        if kind is not None:
            if method != "POST":
                raise ApiError(
                    405, f"{method} is not allowed on {ROUTE_PREFIX}{path} (use POST).", code="method_not_allowed"
                )
            req = parse_request(kind, await self._body(request))
            request.state.model = req.model  # counted in /metrics under its model (or "(unknown)")
            return await self.relay.answer(req, context.for_model(req.model), on_stream_end=self._stream_ended)
        if path == "/models" or path.startswith("/models/"):
            if method != "GET":
                raise ApiError(
                    405, f"{method} is not allowed on {ROUTE_PREFIX}{path} (use GET).", code="method_not_allowed"
                )
            if path == "/models":
                return json_answer(
                    200, {"object": "list", "data": [model_object(n, self.created) for n in self.handles]}
                )
            name = path[len("/models/") :]
            if name not in self.handles:
                raise not_found(name, list(self.handles))
            try:
                info = await self.handles[name].describe.remote()  # a DecoderInfo
            except Exception as exc:
                if replica_gone(exc):
                    raise unavailable(name) from None
                raise
            # other clients' requests, PIDs and paths stay in the server without --debug-info
            return json_answer(
                200, model_object(name, self.created, info.to_dict() if self.debug_info else info.public_dict())
            )
        from ortpilot.serve.http import printable

        raise ApiError(
            404,
            f"No route {printable(method, 20)} {printable(request.url.path)}: this server has GET /v1/models, "
            "POST /v1/completions and POST /v1/chat/completions.",
            code="not_found",
        )


__all__ = ["OpenAIErrors", "OpenAIIngress"]
