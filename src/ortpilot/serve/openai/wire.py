"""The OpenAI API's wire format for decoders: requests checked into records, replies, SSE chunks, errors.

Plain data, no Ray and no HTTP server: the ingress (``ingress``) reads JSON into a
:class:`GenerationRequest` with :func:`parse_request`, a decoder replica turns it into tokens,
and the functions here shape what goes back, as OpenAI's reference documents it:
``/v1/completions`` (``text_completion``) and ``/v1/chat/completions`` (``chat.completion`` and
its ``chat.completion.chunk`` stream), errors as ``{"error": {"message", "type", "param", "code"}}``.
A field the server does not implement (``n`` > 1, ``logprobs``, tools, a non-zero
``presence_penalty`` or ``frequency_penalty``) is refused with a 400 naming it rather than ignored,
and so is a field OpenAI's API does not have (``repetition_penalty``, ``top_k``: other servers'
sampling parameters), which this server would otherwise ignore without a word.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from ortpilot.serve import openaiapi
from ortpilot.serve.context import RequestContext
from ortpilot.serve.http import printable
from ortpilot.serve.jsonbody import not_json_reason

ROLES = ("system", "developer", "user", "assistant")
MAX_STOP = 4  # OpenAI's limit on stop sequences
MAX_STOP_CHARS = 1000  # per stop sequence: each token's stop check costs its length
MAX_SEED = 2**64  # numpy's seeded generator takes 0 .. 2**64 - 1 here
ROUTE_PREFIX = "/v1"  # where the API lives (the application mounts at /)
DEFAULT_COMPLETION_TOKENS = 16  # OpenAI's documented default for /v1/completions
_UNSUPPORTED = {
    "logprobs": (None, False, 0),
    "top_logprobs": (None, 0),
    "echo": (None, False),
    "best_of": (None, 1),
    "suffix": (None, ""),
    "tools": (None, []),
    "functions": (None, []),
    "logit_bias": (None, {}),
    "response_format": (None, {"type": "text"}),
    # The sampler applies no penalties: 0 (OpenAI's default) is what every request gets.
    "presence_penalty": (None, 0),
    "frequency_penalty": (None, 0),
    # Chat fields that would change the answer or its form: only their "off" values.
    "tool_choice": (None, "none", "auto"),
    "function_call": (None, "none", "auto"),
    "modalities": (None, ["text"]),
    "audio": (None,),
    "prediction": (None,),
    "reasoning_effort": (None,),
    "verbosity": (None,),
    "web_search_options": (None,),
}
# The fields each endpoint reads, or takes as they change no answer (``user``, ``metadata``, ``store`` ...);
# with ``_UNSUPPORTED`` they are OpenAI's parameters of the endpoint, and any other field is refused.
_COMMON = frozenset({"model", "max_tokens", "temperature", "top_p", "n", "stop", "seed", "stream", "stream_options"})
_TAKEN = {
    "completion": _COMMON | {"prompt", "user"},
    "chat": _COMMON
    | {
        "messages",
        "max_completion_tokens",
        "user",
        "metadata",
        "store",
        "service_tier",
        "parallel_tool_calls",
        "prompt_cache_key",
        "safety_identifier",
    },
}
SAMPLING = ("temperature", "top_p", "seed", "stop", "max_tokens")  # what the sampler takes (messages name them)
_HINTS = {
    "presence_penalty": " (only 0: the sampler applies no penalty)",
    "frequency_penalty": " (only 0: the sampler applies no penalty)",
}


class ApiError(openaiapi.ApiError):
    """An error reply (``serve.openaiapi.ApiError``) that also crosses Ray as a generation's ``error`` event."""

    def to_event(self) -> DecodeEvent:
        return DecodeEvent(
            ERROR,
            status=self.status,
            message=self.message,
            kind=self.kind,
            param=self.param,
            code=self.code,
            retry_after_s=self.retry_after_s,
        )

    @classmethod
    def from_event(cls, event: DecodeEvent) -> ApiError:
        return cls(
            event.status,
            event.message,
            kind=event.kind or "invalid_request_error",
            param=event.param,
            code=event.code,
            retry_after_s=event.retry_after_s,
        )


START, DELTA, END, ERROR, RESTART = "start", "delta", "end", "error", "restart"


@dataclass(frozen=True)
class DecodeEvent:
    """One event of a generation, as a decoder replica streams it to the ingress across Ray: ``start``
    (the prompt's tokens), ``delta`` (text), ``end`` (finish reason and usage) or one ``error`` (an
    ApiError's fields: the exception itself does not cross). ``restart`` is the relay's own: the
    replica died and the request runs again on another one."""

    type: str
    text: str = ""
    prompt_tokens: int = 0
    completion_tokens: int = 0
    finish_reason: str = ""
    status: int = 0
    message: str = ""
    kind: str = ""
    param: str | None = None
    code: str | None = None
    retry_after_s: int | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, doc: Mapping[str, Any]) -> DecodeEvent:
        return cls(**dict(doc))


json_answer = openaiapi.json_answer


def deadline_error(context: RequestContext) -> ApiError:
    """The 504 of a request whose ``RequestContext`` deadline passed before its answer (or its first token)."""
    return ApiError.expired(context)


def not_found(model: str, known: list[str]) -> ApiError:
    return ApiError.unknown_model(model, known)


@dataclass
class GenerationRequest:
    """One completion or chat completion, checked: what a decoder replica needs to run it."""

    kind: str  # "completion" | "chat"
    model: str
    prompt: str | list[int] | None = None  # completions: text or token ids
    messages: list[dict[str, str]] = field(default_factory=list)  # chat: role + text content
    max_tokens: int | None = None  # None: the default of the kind (16, or the rest of the context for chat)
    temperature: float = 1.0
    top_p: float = 1.0
    stop: list[str] = field(default_factory=list)
    seed: int | None = None
    stream: bool = False
    include_usage: bool = False

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, doc: dict[str, Any]) -> GenerationRequest:
        return cls(**doc)


def _number(body: dict[str, Any], name: str, default: float, low: float, high: float) -> float:
    value = body.get(name)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not low <= value <= high:
        raise ApiError(
            400, f"'{name}' must be a number from {low:g} to {high:g}; got {value!r}.", param=name, code="invalid_value"
        )
    return float(value)


def _integer(body: dict[str, Any], name: str) -> int | None:
    value = body.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise ApiError(400, f"'{name}' must be an integer; got {value!r}.", param=name, code="invalid_type")
    return value


def _content(message: dict[str, Any], index: int) -> str:
    content = message.get("content")
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # content parts: only text ones
        parts = []
        for part in content:
            if not isinstance(part, dict) or part.get("type") != "text" or not isinstance(part.get("text"), str):
                raise ApiError(
                    400,
                    f'messages[{index}].content: only text parts ({{"type": "text", "text": '
                    "...}) are supported by a text decoder.",
                    param=f"messages[{index}].content",
                    code="invalid_value",
                )
            parts.append(part["text"])
        return "".join(parts)
    if content is None and message.get("role") == "assistant":
        return ""
    raise ApiError(
        400,
        f"messages[{index}].content must be a string or a list of text parts; got {type(content).__name__}.",
        param=f"messages[{index}].content",
        code="invalid_type",
    )


def _messages(body: dict[str, Any]) -> list[dict[str, str]]:
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise ApiError(
            400,
            '\'messages\' must be a non-empty list of {"role", "content"} objects.',
            param="messages",
            code="invalid_value",
        )
    out = []
    for i, message in enumerate(messages):
        if not isinstance(message, dict):
            raise ApiError(
                400,
                f"messages[{i}] must be an object with 'role' and 'content'.",
                param=f"messages[{i}]",
                code="invalid_type",
            )
        role = message.get("role")
        if role not in ROLES:
            raise ApiError(
                400,
                f"messages[{i}].role {role!r} is not one of {', '.join(ROLES)}.",
                param=f"messages[{i}].role",
                code="invalid_value",
            )
        out.append({"role": "system" if role == "developer" else role, "content": _content(message, i)})
    return out


def _prompt(body: dict[str, Any]) -> str | list[int]:
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
        prompt = prompt[0]  # a batch of one
    if isinstance(prompt, str) and prompt:
        return prompt
    if isinstance(prompt, list) and prompt and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
        return list(prompt)
    if isinstance(prompt, list) and len(prompt) > 1:
        raise ApiError(
            400, "'prompt' holds several prompts; send one request per prompt.", param="prompt", code="invalid_value"
        )
    raise ApiError(
        400, "'prompt' must be a non-empty string (or a list of token ids).", param="prompt", code="invalid_value"
    )


def _stop(body: dict[str, Any]) -> list[str]:
    stop = body.get("stop")
    if stop is None:
        return []
    stops = [stop] if isinstance(stop, str) else stop
    if not isinstance(stops, list) or not all(isinstance(s, str) for s in stops) or len(stops) > MAX_STOP:
        raise ApiError(
            400, f"'stop' must be a string or a list of at most {MAX_STOP} strings.", param="stop", code="invalid_value"
        )
    if any(len(s) > MAX_STOP_CHARS for s in stops):
        longest = max(len(s) for s in stops)
        raise ApiError(
            400,
            f"A stop sequence has {longest} characters; this server takes at most {MAX_STOP_CHARS} per sequence.",
            param="stop",
            code="invalid_value",
        )
    return [s for s in stops if s]


def _seed(body: dict[str, Any]) -> int | None:
    seed = _integer(body, "seed")
    if seed is not None and not 0 <= seed < MAX_SEED:
        raise ApiError(400, f"'seed' must be from 0 to 2**64 - 1; got {seed}.", param="seed", code="invalid_value")
    return seed


def parse_request(kind: str, raw: bytes) -> GenerationRequest:
    """The JSON body of ``/v1/completions`` (kind ``completion``) or ``/v1/chat/completions`` (``chat``)."""
    try:
        body = json.loads(raw or b"null")
    except RecursionError:
        raise ApiError(400, "The request body nests JSON too deeply.", code="invalid_json") from None
    except ValueError as exc:
        raise ApiError(
            400, f"The request body is not valid JSON ({not_json_reason(raw or b'', exc)}).", code="invalid_json"
        ) from None
    if not isinstance(body, dict):
        raise ApiError(400, "The request body must be a JSON object.", code="invalid_json")
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise ApiError(
            400, "'model' must name a served model (GET /v1/models lists them).", param="model", code="invalid_value"
        )
    n = _integer(body, "n")
    if n not in (None, 1):
        raise ApiError(400, f"'n' = {n}: this server returns one choice per request.", param="n", code="unsupported")
    for name, allowed in _UNSUPPORTED.items():
        if name in body and body[name] not in allowed:
            raise ApiError(
                400, f"'{name}' is not supported by this server{_HINTS.get(name, '')}.", param=name, code="unsupported"
            )
    unknown = sorted(name for name in body if name not in _TAKEN[kind] and name not in _UNSUPPORTED)
    if unknown:
        name = unknown[0]
        raise ApiError(
            400,
            f"'{printable(name, 80)}' is not a parameter of {ROUTE_PREFIX}/{'chat/' if kind == 'chat' else ''}"
            f"completions this server takes; remove it (its sampling parameters are {', '.join(SAMPLING)}).",
            param=printable(name, 80),
            code="unsupported",
        )
    name = "max_tokens"
    max_tokens = _integer(body, "max_tokens")
    if kind == "chat" and body.get("max_completion_tokens") is not None:
        name, max_tokens = "max_completion_tokens", _integer(body, "max_completion_tokens")
    if max_tokens is not None and max_tokens < 1:
        raise ApiError(400, f"'{name}' must be at least 1; got {max_tokens}.", param=name, code="invalid_value")
    options = body.get("stream_options")
    if options is not None and not isinstance(options, dict):
        raise ApiError(400, "'stream_options' must be an object.", param="stream_options", code="invalid_type")
    stream = body.get("stream", False)
    if not isinstance(stream, bool) and stream is not None:
        raise ApiError(400, "'stream' must be true or false.", param="stream", code="invalid_type")
    return GenerationRequest(
        kind=kind,
        model=model,
        prompt=_prompt(body) if kind == "completion" else None,
        messages=_messages(body) if kind == "chat" else [],
        max_tokens=max_tokens,
        temperature=_number(body, "temperature", 1.0, 0.0, 2.0),
        top_p=_number(body, "top_p", 1.0, 0.0, 1.0) or 1e-9,
        stop=_stop(body),
        seed=_seed(body),
        stream=bool(stream),
        include_usage=bool((options or {}).get("include_usage")),
    )


# Replies.
def new_id(kind: str) -> str:
    return f"{'chatcmpl' if kind == 'chat' else 'cmpl'}-{uuid.uuid4().hex[:24]}"


model_object = openaiapi.model_object


def usage(prompt_tokens: int, completion_tokens: int) -> dict[str, int]:
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    }


def completion_body(
    request: GenerationRequest, ident: str, created: int, text: str, finish_reason: str, counts: dict[str, int]
) -> dict[str, Any]:
    if request.kind == "chat":
        choice = {
            "index": 0,
            "message": {"role": "assistant", "content": text},
            "logprobs": None,
            "finish_reason": finish_reason,
        }
        kind = "chat.completion"
    else:
        choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": finish_reason}
        kind = "text_completion"
    return {
        "id": ident,
        "object": kind,
        "created": created,
        "model": request.model,
        "choices": [choice],
        "usage": counts,
    }


def chunk_body(
    request: GenerationRequest,
    ident: str,
    created: int,
    text: str | None,
    finish_reason: str | None = None,
    *,
    first: bool = False,
    counts: dict[str, int] | None = None,
) -> dict[str, Any]:
    """One streamed chunk; ``counts`` makes it the usage chunk (no choices) of ``include_usage``."""
    if request.kind == "chat":
        delta: dict[str, Any] = {"role": "assistant", "content": ""} if first else {}
        if text:
            delta["content"] = text
        choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}
        kind = "chat.completion.chunk"
    else:
        choice = {"index": 0, "text": text or "", "logprobs": None, "finish_reason": finish_reason}
        kind = "text_completion"
    doc: dict[str, Any] = {
        "id": ident,
        "object": kind,
        "created": created,
        "model": request.model,
        "choices": [] if counts is not None else [choice],
    }
    if counts is not None or request.include_usage:
        doc["usage"] = counts
    return doc


def sse(doc: dict[str, Any] | str) -> bytes:
    """One server-sent event: ``data: {json}`` (or ``data: [DONE]``) and a blank line."""
    data = doc if isinstance(doc, str) else json.dumps(doc, separators=(",", ":"), ensure_ascii=False)
    return f"data: {data}\n\n".encode()


def finish_reason(stop_reason: str) -> str:
    """The scheduler's stop reason in OpenAI's words: a stop id or string is 'stop', a length limit 'length'."""
    return "stop" if stop_reason in ("stop_token", "stop_string") else "length"


def now() -> int:
    return int(time.time())


__all__ = [
    "DEFAULT_COMPLETION_TOKENS",
    "ROLES",
    "ROUTE_PREFIX",
    "ApiError",
    "DecodeEvent",
    "GenerationRequest",
    "chunk_body",
    "completion_body",
    "deadline_error",
    "finish_reason",
    "json_answer",
    "model_object",
    "new_id",
    "not_found",
    "now",
    "parse_request",
    "sse",
    "usage",
]
