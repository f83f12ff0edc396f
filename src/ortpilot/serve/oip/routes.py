"""The Open Inference Protocol (KServe v2 REST) routes, so Triton and KServe clients work unchanged.

Two tables. ``model_routes`` is what one model's replica answers itself (the model's metadata
and readiness, infer with JSON tensors or the binary-tensor extension): requests for a model go
straight to its replicas, one hop. ``server_routes`` is the server-wide application's: health,
server metadata, the repository index, ``/metrics`` summed over every replica, and an answer
for every path no model claims (404 for an unknown model, 503 with Retry-After for a known one
that has no ready replica: starting, restarting or draining). Model metadata adds what a Triton
server cannot say: each live replica's providers, placement share, threads and how it was
verified.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any

from ortpilot.errors import InputError
from ortpilot.serve.context import RequestContext
from ortpilot.serve.defaults import HEALTH_PATHS, LIVE_PATH, READY_PATH
from ortpilot.serve.errorbody import OIP
from ortpilot.serve.http import Reply, Route, error_reply, internal_error, json_reply, printable, route
from ortpilot.serve.oip.codec import BINARY_TYPE, HEADER_LENGTH, decode_request, encode_response

EXTENSIONS = ["binary_tensor_data"]
VERSIONS = ["1"]
RETRY_AFTER_S = 1
_BYTE_COUNT = re.compile(r"[0-9]{1,18}")  # ASCII digits only: str.isdigit() takes "²", which int() refuses
_MODEL_PATH = re.compile(r"^/v2/models/([^/]+)(/.*)?$")


def unknown_model(name: str, served: Iterable[str]) -> str:
    """The message for a model name this server does not serve (REST 404, gRPC NOT_FOUND)."""
    return f"Unknown model '{printable(name, 80)}'. This server serves: {', '.join(sorted(served))}."


def unknown_here(name: str, version: str) -> str:
    """The message of a gRPC call a model's replica got for another model or version (NOT_FOUND)."""
    return f"Unknown model {printable(name, 80)!r} version {printable(version, 40)!r} here."


def no_replica(name: str, why: str = "") -> str:
    """The message for a served model with no ready replica now (REST 503, gRPC UNAVAILABLE)."""
    return f"Model '{name}' has no ready replica{f' ({why})' if why else ''}; retry."


def unknown_version(name: str, version: str) -> Reply:
    return error_reply(
        404, f"Model '{name}' has no version {printable(version, 40)!r}; it serves version 1.", model=name
    )


def model_routes(model: Any) -> list[Route]:
    """The routes one model's replica answers: ``model`` is the replica (its name, metadata and infer)."""
    name = model.name

    async def metadata(request: Any, context: RequestContext, version: str = "1") -> Reply:
        if version not in VERSIONS:
            return unknown_version(name, version)
        return json_reply(200, await model.metadata(), model=name)

    async def ready(request: Any, context: RequestContext, version: str = "1") -> Reply:
        if version not in VERSIONS:
            return unknown_version(name, version)
        return json_reply(200, {"name": name, "ready": True}, model=name)

    async def infer(request: Any, context: RequestContext, version: str = "1") -> Reply:
        if version not in VERSIONS:
            return unknown_version(name, version)
        body = await model.read_body(request)
        if isinstance(body, Reply):
            body.model = name
            return body
        header = request.headers.get(HEADER_LENGTH)
        try:
            if header is not None and not _BYTE_COUNT.fullmatch(header.strip()):
                raise InputError(f"Inference-Header-Content-Length {printable(header, 40)!r} is not a byte count.")
            decoded = decode_request(body, int(header) if header is not None else None)
        except InputError as exc:
            return error_reply(400, str(exc), model=name)
        result = await model.infer(decoded.feeds, decoded.outputs, context)
        if not result.ok:
            return error_reply(result.status, result.error, model=name)
        binary = decoded.binary_outputs if decoded.outputs is not None else decoded.binary_default
        payload, head = encode_response(name, result.outputs, binary, decoded.id)
        if head is None:
            return Reply(200, payload, model=name)
        return Reply(200, payload, BINARY_TYPE, {"Inference-Header-Content-Length": str(head)}, model=name)

    base = f"/v2/models/{name}"
    return [
        route("GET", base, metadata),
        route("GET", base + "/versions/{version}", metadata),
        route("GET", base + "/ready", ready),
        route("GET", base + "/versions/{version}/ready", ready),
        route("POST", base + "/infer", infer),
        route("POST", base + "/versions/{version}/infer", infer),
    ]


def server_routes(server: Any) -> list[Route]:
    """The server-wide application's routes; ``server`` holds the served names, metadata and metrics."""

    async def live(request: Any, context: RequestContext) -> Reply:
        return json_reply(200, {"live": True})

    async def server_ready(request: Any, context: RequestContext) -> Reply:
        states = {name: server.ready(name) for name in server.names}
        ok = all(states.values()) and not server.draining
        return json_reply(200 if ok else 503, {"ready": ok, "models": states})

    async def server_metadata(request: Any, context: RequestContext) -> Reply:
        from ortpilot.version import __version__

        return json_reply(200, {"name": "ortpilot", "version": __version__, "extensions": EXTENSIONS})

    async def repository_index(request: Any, context: RequestContext) -> Reply:
        return json_reply(
            200,
            [
                {"name": name, "version": "1", "state": "READY" if server.ready(name) else "UNAVAILABLE"}
                for name in server.names
            ],
        )

    async def metrics(request: Any, context: RequestContext) -> Reply:
        body, content_type = server.metrics.render()
        return Reply(200, body, content_type)

    return [
        route("GET", LIVE_PATH, live),
        route("GET", READY_PATH, server_ready),
        route("GET", "/v2", server_metadata),
        route("POST", "/v2/repository/index", repository_index),
        route("GET", "/metrics", metrics),
    ]


def unclaimed(server: Any, path: str) -> Reply | None:
    """The answer to a model path no model application claimed: an unknown model (404), or a known one
    with no ready replica (503 + Retry-After); None when the path is not a model's."""
    match = _MODEL_PATH.match(path)
    if match is None:
        return None
    name = match.group(1)
    if name not in server.names:
        return error_reply(404, unknown_model(name, server.names), model=name)
    why = "the server is draining" if server.draining else "it is starting or restarting"
    reply = error_reply(503, no_replica(name, why), model=name)
    reply.headers = {"Retry-After": str(RETRY_AFTER_S)}
    return reply


HEALTH = frozenset(HEALTH_PATHS)  # open without a key unless --auth-health


class OipErrors:
    """The Open Inference Protocol's ``pipeline.ErrorShape``: ``{"error": "..."}`` for each."""

    protocol = OIP

    def refusal(self, verdict: Any, model: str | None) -> Reply:
        return refusal(verdict, model)

    def failure(self, what: str, exc: Exception, context: RequestContext) -> Reply:
        return error_reply(500, internal_error(what, exc, context.request_id))

    def expired(self, context: RequestContext) -> Reply:
        return error_reply(504, context.expired_message(), context.model)


def refusal(verdict: Any, model: str | None = None) -> Reply:
    """The protocol's answer to a request the guard stopped (``guard.Verdict``): its error shape, or an
    empty 204 for a CORS preflight."""
    if verdict.status == 204:
        return Reply(204, b"", "text/plain", dict(verdict.headers), model=model)
    reply = error_reply(verdict.status, verdict.message, model)
    reply.headers = dict(verdict.headers)
    return reply


__all__ = [
    "EXTENSIONS",
    "HEALTH",
    "RETRY_AFTER_S",
    "VERSIONS",
    "OipErrors",
    "model_routes",
    "no_replica",
    "refusal",
    "server_routes",
    "unclaimed",
    "unknown_here",
    "unknown_model",
]
