"""The error body of each protocol, defined once: the Open Inference Protocol's ``{"error": "..."}`` and
OpenAI's ``{"error": {"message", "type", "param", "code"}}``. The replicas, the OpenAI ingress and the
error pages HAProxy answers with itself all build theirs here, so a client sees one shape per protocol
whoever answered."""

from __future__ import annotations

import json
from typing import Any

OIP = "oip"  # the protocol names a server speaks (``plan``, HAProxy's error pages)
OPENAI = "openai"


def oip_error(message: str) -> dict[str, Any]:
    return {"error": message}


def openai_error(
    message: str, kind: str = "invalid_request_error", param: str | None = None, code: str | None = None
) -> dict[str, Any]:
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}


def error_json(protocol: str, message: str, code: str, server_side: bool = False) -> bytes:
    """An error body in ``protocol``'s shape, as compact JSON (``server_side``: OpenAI's ``server_error``)."""
    if protocol == OPENAI:
        doc = openai_error(message, "server_error" if server_side else "invalid_request_error", None, code)
    else:
        doc = oip_error(message)
    return json.dumps(doc, separators=(",", ":")).encode()


__all__ = ["OIP", "OPENAI", "error_json", "oip_error", "openai_error"]
