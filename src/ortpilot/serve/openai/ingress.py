"""The OpenAI-compatible ingress: ``/v1`` (models, completions, chat completions), ``/metrics`` and the
health probes, in front of one deployment per decoder.

The ingress parses and checks a request (400 for bad input, 404 for an unknown model) through the
request pipeline (``serve.pipeline``: guard, route, errors in OpenAI's shape, CORS, count, access
log), calls a decoder replica's ``generate`` as a streaming handle call, and answers with one JSON
body or server-sent events ending in ``data: [DONE]``. When a client goes away, Ray cancels the
ingress's request and its handle call; the replica's generator cancels the stream, and the
scheduler frees the slot before its next step. A replica that dies before a request's first token
is replaced by another replica's run. Ray is imported only inside the functions here.
"""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterator
from contextlib import aclosing
from typing import Any

from ortpilot.serve.defaults import HEALTH_PATHS, REPLICA_RETRIES, retry_delay_s
from ortpilot.serve.http import Reply, replica_gone
from ortpilot.serve.openai.metrics import DecoderMetrics
from ortpilot.serve.openai.wire import (
    ROUTE_PREFIX,
    ApiError,
    GenerationRequest,
    chunk_body,
    completion_body,
    finish_reason,
    model_object,
    new_id,
    not_found,
    now,
    parse_request,
    sse,
    usage,
)
from ortpilot.serve.pipeline import Pipeline
from ortpilot.serve.records import RequestSettings

log = logging.getLogger("ortpilot")


def _json(status: int, doc: Any, headers: dict[str, str] | None = None) -> Reply:
    return Reply(status, json.dumps(doc, separators=(",", ":"), ensure_ascii=False).encode(), headers=headers or None)


def _error(exc: ApiError) -> Reply:
    return _json(exc.status, exc.body(), exc.headers())


class OpenAIErrors:
    """OpenAI's ``pipeline.ErrorShape``: ``{"error": {"message", "type", "param", "code"}}``; an ApiError a
    route raised is its own answer, any other exception a 500 with a request id."""

    def refusal(self, verdict: Any, model: str | None) -> Reply:
        if verdict.status == 204:  # a CORS preflight
            return Reply(204, b"", "text/plain", dict(verdict.headers))
        return _json(
            verdict.status, ApiError(verdict.status, verdict.message, code=verdict.code).body(), verdict.headers
        )

    def failure(self, what: str, exc: Exception) -> Reply:
        if isinstance(exc, ApiError):
            return _error(exc)
        from ortpilot.serve.http import internal_error

        return _error(ApiError(500, internal_error(what, exc), kind="server_error", code=None))


SERVER_PATHS = ("/metrics", *HEALTH_PATHS)
PUBLIC_INFO = ("pid", "source", "recent")  # what GET /v1/models/NAME shows only with --debug-info


class OpenAIIngress:
    """``GET /v1/models``, ``GET /v1/models/{name}``, ``POST /v1/completions``, ``POST /v1/chat/completions``.

    Every request passes the guard (Host, Origin, API key) first; bodies are read with the size limit and
    the request timeout; an unexpected failure is a 500 in OpenAI's shape with a request id (logged once);
    a replica that dies before a request's first token is replaced by another replica's run (a stream that
    already sent tokens ends with an error event). After ``drain`` new requests get 503 with Retry-After."""

    def __init__(self, handles: dict[str, Any], settings: RequestSettings | None = None) -> None:
        from ortpilot.serve.http import replica_logging

        replica_logging()
        self.settings = settings or RequestSettings()
        self.handles = dict(handles)
        self.created = now()
        self.pipeline = Pipeline(self.settings, OpenAIErrors(), self._observe)
        self.guard = self.pipeline.guard
        self.debug_info = self.settings.debug_info
        self.draining = False
        self.in_flight = 0  # requests being answered, streams included (drain waits for none)
        self.metrics = DecoderMetrics(list(self.handles))

    async def report(self, model: str, replica: str, counters: dict[str, Any]) -> None:
        """A decoder replica's heartbeat: its engine's cumulative counters."""
        self.metrics.report(model, replica, counters)

    async def __call__(self, request: Any) -> Any:
        full = request.url.path.rstrip("/") or "/"
        self.in_flight += 1
        response = None
        try:
            response = await self.pipeline.handle(
                request, lambda: self._answer(request, full), health=full in HEALTH_PATHS
            )
            return response
        finally:
            if type(response).__name__ != "StreamingResponse":  # a stream counts until it ends (``_sse``)
                self.in_flight -= 1

    async def _answer(self, request: Any, full: str) -> Reply:
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
        return await self._route(request.method, path, request)

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
        if path == "/v2/health/live":
            return _json(200, {"live": True})
        _, reports = self.metrics.snapshot()
        states = {name: any(m == name and alive for m, _, alive in reports) for name in self.handles}
        ok = all(states.values()) and not self.draining
        return _json(200 if ok else 503, {"ready": ok, "models": states})

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

    async def _route(self, method: str, path: str, request: Any) -> Reply:
        kind = {"/completions": "completion", "/chat/completions": "chat"}.get(path)
        if kind is not None:
            if method != "POST":
                raise ApiError(
                    405, f"{method} is not allowed on {ROUTE_PREFIX}{path} (use POST).", code="method_not_allowed"
                )
            req = parse_request(kind, await self._body(request))
            request.state.model = req.model  # counted in /metrics under its model (or "(unknown)")
            return await self._generate(req)
        if path == "/models" or path.startswith("/models/"):
            if method != "GET":
                raise ApiError(
                    405, f"{method} is not allowed on {ROUTE_PREFIX}{path} (use GET).", code="method_not_allowed"
                )
            if path == "/models":
                return _json(200, {"object": "list", "data": [model_object(n, self.created) for n in self.handles]})
            name = path[len("/models/") :]
            if name not in self.handles:
                raise not_found(name, list(self.handles))
            info = await self.handles[name].describe.remote()
            if not self.debug_info:  # other clients' requests, PIDs and paths stay in the server
                info = {k: v for k, v in info.items() if k not in PUBLIC_INFO}
            return _json(200, model_object(name, self.created, info))
        from ortpilot.serve.http import printable

        raise ApiError(
            404,
            f"No route {printable(method, 20)} {printable(request.url.path)}: this server has GET /v1/models, "
            "POST /v1/completions and POST /v1/chat/completions.",
            code="not_found",
        )

    async def _open(self, req: GenerationRequest) -> tuple[dict[str, Any], Any]:
        """(the replica's first event, its event stream), on another replica when the first one died first."""
        import asyncio

        handle = self.handles.get(req.model)
        if handle is None:
            raise not_found(req.model, list(self.handles))
        for attempt in range(REPLICA_RETRIES + 1):
            events = handle.options(stream=True).generate.remote(req)
            try:
                return await events.__anext__(), events
            except StopAsyncIteration:
                raise ApiError(
                    500, "the decoder replica ended the request without an answer", kind="server_error"
                ) from None
            except Exception as exc:
                if type(exc).__name__ == "BackPressureError":
                    raise ApiError(
                        429,
                        f"Every replica of '{req.model}' is at its limit; retry later.",
                        kind="rate_limit_error",
                        code="rate_limit_exceeded",
                        retry_after_s=1,
                    ) from None
                if not replica_gone(exc) or attempt == REPLICA_RETRIES:
                    raise
                log.warning("A replica of '%s' went away before answering; retrying on another.", req.model)
                await asyncio.sleep(retry_delay_s(attempt))
        raise AssertionError("unreachable")

    async def _events(self, req: GenerationRequest, events: Any, restart: bool) -> AsyncIterator[dict[str, Any]]:
        """The events after the first. A replica that dies before the first ``delta`` (or, with ``restart``,
        at any point: a request nothing was sent for yet) is replaced by a new run on another replica; then a
        ``restart`` event tells the caller to forget what it collected."""
        retries, sent = 0, False
        try:
            while True:
                try:
                    async for event in events:
                        sent = sent or event["type"] == "delta"
                        yield event
                    return
                except Exception as exc:
                    if not replica_gone(exc) or retries >= REPLICA_RETRIES or (sent and not restart):
                        raise
                    retries += 1
                    log.warning("A replica of '%s' died during a request; running it again on another.", req.model)
                    first, events = await self._open(req)
                    if first["type"] == "error":
                        yield first
                        return
                    sent = False
                    yield {"type": "restart"}
        finally:
            events.cancel()  # a client gone: the replica cancels its stream (a no-op after the end)

    async def _generate(self, req: GenerationRequest) -> Reply:
        first, events = await self._open(req)
        if first["type"] == "error":
            return _error(ApiError.from_event(first))
        ident, created = new_id(req.kind), now()
        if req.stream:
            stream = self._sse(req, ident, created, first, events)
            return Reply(200, b"", "text/event-stream", {"Cache-Control": "no-cache"}, stream=stream)
        parts, end = [], None
        async with aclosing(self._events(req, events, restart=True)) as stream:
            async for event in stream:
                if event["type"] == "restart":
                    parts, end = [], None
                elif event["type"] == "delta":
                    parts.append(event["text"])
                elif event["type"] == "end":
                    end = event
                elif event["type"] == "error":
                    return _error(ApiError.from_event(event))
        if end is None:
            raise ApiError(500, "the decoder replica ended the request without an answer", kind="server_error")
        return _json(
            200,
            completion_body(
                req,
                ident,
                created,
                "".join(parts),
                finish_reason(end["finish_reason"]),
                usage(end["prompt_tokens"], end["completion_tokens"]),
            ),
        )

    async def _sse(
        self, req: GenerationRequest, ident: str, created: int, first: dict[str, Any], events: Any
    ) -> AsyncIterator[bytes]:
        stream = self._events(req, events, restart=False)
        try:
            if req.kind == "chat":
                yield sse(chunk_body(req, ident, created, None, first=True))
            async for event in stream:
                if event["type"] == "delta":
                    yield sse(chunk_body(req, ident, created, event["text"]))
                elif event["type"] == "end":
                    yield sse(chunk_body(req, ident, created, None, finish_reason(event["finish_reason"])))
                    if req.include_usage:
                        yield sse(
                            chunk_body(
                                req,
                                ident,
                                created,
                                None,
                                counts=usage(event["prompt_tokens"], event["completion_tokens"]),
                            )
                        )
                elif event["type"] == "error":
                    yield sse(ApiError.from_event(event).body())
                    return
            yield sse("[DONE]")
        except Exception as exc:  # the replica died after tokens were sent: the stream ends with an error event
            from ortpilot.serve.http import internal_error

            gone = replica_gone(exc)
            message = (
                "The replica generating this stream went away after it had sent tokens; send the request again."
                if gone
                else internal_error(f"stream {ROUTE_PREFIX} {req.kind}", exc)
            )
            yield sse(ApiError(503 if gone else 500, message, kind="server_error").body())
        finally:
            await stream.aclose()  # cancels the replica's stream (a no-op after the end)
            self.in_flight -= 1


__all__ = ["OpenAIErrors", "OpenAIIngress"]
