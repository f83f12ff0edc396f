"""Starlette requests built in-process, for calling a deployment's ``__call__`` without Ray or a socket."""

from __future__ import annotations

import json
from typing import Any


def request(method: str, path: str, body: bytes | dict | None = None, headers: dict[str, str] | None = None) -> Any:
    """A Starlette ``Request`` for ``method path`` from 127.0.0.1 with ``headers`` and ``body`` (a dict: JSON)."""
    from starlette.requests import Request

    raw = json.dumps(body).encode() if isinstance(body, dict) else (body or b"")
    head = {"host": "127.0.0.1:8000", **({"content-length": str(len(raw))} if raw else {}), **(headers or {})}
    scope = {
        "type": "http",
        "method": method,
        "path": path,
        "raw_path": path.encode(),
        "query_string": b"",
        "root_path": "",
        "scheme": "http",
        "http_version": "1.1",
        "headers": [(k.lower().encode(), v.encode()) for k, v in head.items()],
        "client": ("127.0.0.1", 50000),
        "server": ("127.0.0.1", 8000),
    }
    sent = False

    async def receive() -> dict[str, Any]:
        nonlocal sent
        if sent:
            return {"type": "http.disconnect"}
        sent = True
        return {"type": "http.request", "body": raw, "more_body": False}

    return Request(scope, receive)


def body(response: Any) -> Any:
    """The JSON document of a Starlette response."""
    return json.loads(bytes(response.body))


class GrpcContext:
    """What Ray Serve hands a gRPC method: invocation metadata in, a status code and details out."""

    def __init__(self, metadata: dict[str, str] | None = None) -> None:
        self.metadata = list((metadata or {}).items())
        self.code: Any = None
        self.details = ""

    def invocation_metadata(self) -> list[tuple[str, str]]:
        return self.metadata

    def set_code(self, code: Any) -> None:
        self.code = code

    def set_details(self, details: str) -> None:
        self.details = details
