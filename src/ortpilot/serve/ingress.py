"""The HTTP ingress: one route table that protocol modules add to, the request metrics, the access log.

Requests arrive as Starlette requests from Ray Serve's proxy. A route is (method, path pattern,
handler); ``oip.routes`` gives the Open Inference Protocol's, and another protocol (an OpenAI-
compatible API for decoders) adds its own table to the same ingress without touching these.
The ingress runs one replica per application, so its counters are the application's totals
(``metrics``); the model replicas report to it through ``report``.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Mapping, Sequence
from typing import Any

from ortpilot.serve.http import Reply, Route, error_reply, json_reply, route
from ortpilot.serve.metrics import ServeMetrics

INGRESS_NAME = "ortpilot-ingress"


class Ingress:
    """The application's entry deployment: dispatches to routes, counts, logs, takes replica reports."""

    def __init__(
        self, models: Mapping[str, Any], metadata: Mapping[str, dict[str, Any]], options: Mapping[str, Any]
    ) -> None:
        from ortpilot.serve import oip

        self.handles = dict(models)  # model name -> DeploymentHandle of its replicas
        self.metadata = dict(metadata)  # model name -> static metadata (inputs, outputs, profile facts)
        self.options = dict(options)
        self.max_request_bytes = int(float(self.options.get("max_request_mb", 64)) * 1024 * 1024)
        self.access_log = bool(self.options.get("access_log", True))
        self.metrics = ServeMetrics(list(self.handles))
        self.routes: list[Route] = []
        self.add_routes(oip.routes(self))

    def add_routes(self, routes: Sequence[Route]) -> None:
        self.routes.extend(routes)

    async def __call__(self, request: Any) -> Any:
        from starlette.responses import Response

        started = time.perf_counter()
        path = request.url.path.rstrip("/") or "/"
        reply = None
        allowed = []
        for r in self.routes:
            match = r.pattern.match(path)
            if match is None:
                continue
            if r.method != request.method:
                allowed.append(r.method)
                continue
            try:
                reply = await r.handler(request, **match.groupdict())
            except Exception as exc:  # a bug must not take the replica down; say what it was
                reply = error_reply(500, f"internal error: {type(exc).__name__}: {exc}")
            break
        if reply is None:
            reply = (
                error_reply(405, f"{request.method} is not allowed on {path} (use {', '.join(allowed)})")
                if allowed
                else error_reply(404, f"no route {request.method} {path}")
            )
        elapsed = time.perf_counter() - started
        if reply.model is not None:
            self.metrics.observe(reply.model, reply.status, elapsed)
        if self.access_log:
            client = request.client.host if request.client else "-"
            sys.stderr.write(
                f'{client} "{request.method} {path}" {reply.status} {len(reply.body)} {elapsed * 1000:.1f}ms\n'
            )
        return Response(reply.body, status_code=reply.status, media_type=reply.content_type, headers=reply.headers)

    async def report(
        self, model: str, replica: str, info: Mapping[str, Any] | None, batches: Mapping[str, Any]
    ) -> None:
        """A model replica's heartbeat: who it is, what it verified, its cumulative batch counts."""
        self.metrics.report(model, replica, info, batches)

    async def read_body(self, request: Any) -> bytes | Reply:
        """The request body, or a 413 reply when it is over ``--max-request-mb`` (checked before reading
        when the client sends Content-Length)."""
        limit = self.max_request_bytes
        declared = request.headers.get("content-length")
        if declared and declared.isdigit() and int(declared) > limit:
            return error_reply(
                413, f"request body of {int(declared)} bytes is over the limit of {limit} bytes (--max-request-mb)"
            )
        chunks, size = [], 0
        async for chunk in request.stream():
            chunks.append(chunk)
            size += len(chunk)
            if size > limit:
                return error_reply(413, f"request body is over the limit of {limit} bytes (--max-request-mb)")
        return b"".join(chunks)


__all__ = ["INGRESS_NAME", "Ingress", "Reply", "Route", "error_reply", "json_reply", "route"]
