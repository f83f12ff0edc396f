"""What every route that speaks OpenAI's API says the same way: the decoder stack's ``/v1`` (``serve.openai``)
and a text model's ``/v1/embeddings``, ``/v1/rerank`` and ``/v1/classify`` (answered by the Open Inference
Protocol stack's replicas, ``serve.oip``, with ``serve.textwire``). ``ApiError`` is an error reply raised where
the request fails (its status and OpenAI's error object); ``OpenAIErrors`` is the request pipeline's
``ErrorShape`` in OpenAI's words (a refused key, a failed route, a missed deadline); ``json_answer`` and
``model_object`` shape what succeeds. The two stacks never import each other, so this lives in the core.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from ortpilot.serve.context import RequestContext
from ortpilot.serve.errorbody import OPENAI, openai_error
from ortpilot.serve.http import Reply, internal_error


class ApiError(Exception):
    """An error reply: HTTP status and OpenAI's error object."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        kind: str = "invalid_request_error",
        param: str | None = None,
        code: str | None = None,
        retry_after_s: int | None = None,
    ) -> None:
        super().__init__(message)
        self.status, self.message, self.kind, self.param, self.code = status, message, kind, param, code
        self.retry_after_s = retry_after_s

    def body(self) -> dict[str, Any]:
        return openai_error(self.message, self.kind, self.param, self.code)

    def headers(self) -> dict[str, str]:
        return {"Retry-After": str(self.retry_after_s)} if self.retry_after_s else {}

    def reply(self, model: str | None = None) -> Reply:
        """This error as a route answers it: its status, OpenAI's error object, Retry-After if any."""
        return json_answer(self.status, self.body(), self.headers(), model)

    @classmethod
    def expired(cls, context: RequestContext) -> ApiError:
        """The 504 of a request whose ``RequestContext`` deadline passed before its answer (or first token)."""
        return cls(504, context.expired_message(), kind="server_error", code="timeout")

    @classmethod
    def unknown_model(cls, model: str, known: list[str]) -> ApiError:
        """The 404 of a ``model`` this server does not serve (``known``: what it serves)."""
        return cls(
            404,
            f"The model '{model}' does not exist; this server has {', '.join(known) or 'none'}.",
            param="model",
            code="model_not_found",
        )


def json_answer(status: int, doc: Any, headers: Mapping[str, str] | None = None, model: str | None = None) -> Reply:
    """A JSON answer as OpenAI's API writes it (compact, UTF-8 text as is)."""
    body = json.dumps(doc, separators=(",", ":"), ensure_ascii=False).encode()
    return Reply(status, body, headers=dict(headers) if headers else None, model=model)


def model_object(name: str, created: int, extra: dict[str, Any] | None = None) -> dict[str, Any]:
    """One entry of ``GET /v1/models`` (``extra``: what ortpilot adds under ``ortpilot``)."""
    doc: dict[str, Any] = {"id": name, "object": "model", "created": created, "owned_by": "ortpilot"}
    if extra:
        doc["ortpilot"] = extra
    return doc


class OpenAIErrors:
    """OpenAI's ``pipeline.ErrorShape``: ``{"error": {"message", "type", "param", "code"}}``; an ApiError a
    route raised is its own answer, any other exception a 500 with the request id, a missed deadline a 504."""

    protocol = OPENAI

    def refusal(self, verdict: Any, model: str | None) -> Reply:
        if verdict.status == 204:  # a CORS preflight
            return Reply(204, b"", "text/plain", dict(verdict.headers))
        return json_answer(
            verdict.status,
            ApiError(verdict.status, verdict.message, code=verdict.code).body(),
            verdict.headers,
            model,
        )

    def failure(self, what: str, exc: Exception, context: RequestContext) -> Reply:
        if isinstance(exc, ApiError):
            return exc.reply(context.model)
        return ApiError(500, internal_error(what, exc, context.request_id), kind="server_error", code=None).reply()

    def expired(self, context: RequestContext) -> Reply:
        return ApiError.expired(context).reply(context.model)


__all__ = ["ApiError", "OpenAIErrors", "json_answer", "model_object"]
