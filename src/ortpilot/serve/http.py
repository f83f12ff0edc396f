"""The HTTP pieces every protocol module of the ingress shares: a reply, a route, the error shape.

Protocol modules (``oip``, the OpenAI API) build their route tables from these; the ingress
(``ingress``) dispatches to them. Neither needs the other's module to do so.
"""

from __future__ import annotations

import json
import re
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any


@dataclass
class Reply:
    """What a handler returns: status, body, content type, extra headers, and the model it concerned."""

    status: int
    body: bytes
    content_type: str = "application/json"
    headers: dict[str, str] | None = None
    model: str | None = None  # set for requests that count in ortpilot_requests_total


def json_reply(status: int, doc: Any, model: str | None = None) -> Reply:
    return Reply(status, json.dumps(doc, separators=(",", ":")).encode(), model=model)


def error_reply(status: int, message: str, model: str | None = None) -> Reply:
    """The protocol's error shape: ``{"error": "..."}``."""
    return json_reply(status, {"error": message}, model)


Handler = Callable[..., Awaitable[Reply]]


@dataclass(frozen=True)
class Route:
    method: str
    pattern: re.Pattern
    handler: Handler


def route(method: str, path: str, handler: Handler) -> Route:
    """``/v2/models/{name}/infer`` -> a route whose handler gets ``name=`` from the path."""
    regex = "^" + re.sub(r"\{(\w+)\}", r"(?P<\1>[^/]+)", path) + "$"
    return Route(method, re.compile(regex), handler)


__all__ = ["Handler", "Reply", "Route", "error_reply", "json_reply", "route"]
