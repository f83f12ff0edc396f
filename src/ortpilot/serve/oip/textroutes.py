"""A text model's routes: OpenAI-style ``/v1/embeddings``, ``/v1/rerank`` and ``/v1/classify``, and KServe v2
``BYTES`` tensors of strings, answered by the model's replicas.

Where a request goes. A client of OpenAI's API names the model in the body. The model's own routes,
``/v2/models/NAME/v1/...`` (``model_text_routes``), are on its replicas: HAProxy sends a ``POST /v1/...``
there when the body names a text model (``serve.haproxy.text_routes``), and a client may point its base
URL there. What HAProxy does not route that way reaches the server-wide application
(``server_text_routes``), which checks the body (``serve.textwire``), finds the model and relays the checked
request to one of its replicas (one more hop, retried on another replica when its replica died first, as
the gRPC relay is). Both end in the replica's ``text_answer``. A KServe v2 infer request whose inputs are ``BYTES`` (``text``, ``[N]`` or ``[N, 1]``, UTF-8
strings, as Triton's string tensors are sent; a cross-encoder also takes ``query``, ``[1]``) is the same
work on the tensor route: ``infer_text`` answers it with the values as a tensor (``embedding`` ``FP32
[N, dim]``, ``score`` ``[N]`` or ``probabilities`` ``[N, labels]``), the tokens each text kept (``tokens``,
``INT64 [N]``) and which were cut (``truncated``, ``BOOL [N]``). Every answer about text is the replica's
text runner's (``textrunner``); errors on the ``/v1`` routes are in OpenAI's shape (``serve.openaiapi``).
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from ortpilot.serve.context import DeadlineExceeded, RequestContext
from ortpilot.serve.defaults import REPLICA_RETRIES, retry_delay_s
from ortpilot.serve.http import BodyError, Reply, Route, find_route, printable, read_body, replica_gone, route
from ortpilot.serve.oip.textrunner import TextAnswer, TextRefused
from ortpilot.serve.openaiapi import ApiError, json_answer, model_object
from ortpilot.serve.textfacts import TextFacts
from ortpilot.serve.textwire import (
    ENDPOINTS,
    ROUTE_PREFIX,
    TextRequest,
    classify_reply,
    embeddings_reply,
    parse_text_request,
    rerank_reply,
    use_of,
)

VALUE_OUTPUT = {"embed": "embedding", "rerank": "score", "classify": "probabilities"}
TEXT_INPUT, QUERY_INPUT = "text", "query"


def no_text(name: str, facts: TextFacts) -> str:
    """The message for text sent to a model that takes none: what it lacks and what it takes instead."""
    return f"Model '{name}' takes no text: {facts.missing}."


def wrong_kind(name: str, kind: str, wanted: str) -> str:
    """The message for an endpoint the model's task does not answer (``/v1/rerank`` on a sentence encoder)."""
    what = {"embed": "a sentence encoder", "rerank": "a cross-encoder", "classify": "a sequence classifier"}
    return (
        f"Model '{name}' is {what[kind]}: it answers {use_of(kind)}, not {use_of(wanted)} (which needs {what[wanted]})."
    )


def check_model(name: str, facts: TextFacts, kind: str) -> None:
    """An ApiError 400 unless model ``name`` answers the endpoint that needs ``kind``."""
    if not facts.text:
        raise ApiError(400, no_text(name, facts), param="model", code="model_not_text")
    if facts.kind != kind:
        raise ApiError(400, wrong_kind(name, facts.kind, kind), param="model", code="wrong_endpoint")


async def body_of(request: Any, max_bytes: int, timeout_s: float) -> bytes:
    """The request body (413 over ``--max-request-mb``, 408 too slow), as OpenAI's errors."""
    try:
        return await read_body(request, max_bytes, timeout_s)
    except BodyError as exc:
        code = "request_too_large" if exc.status == 413 else "request_timeout"
        raise ApiError(exc.status, exc.message, code=code) from None


async def answer_text(runner: Any, request: TextRequest, context: RequestContext) -> Reply:
    """A checked ``TextRequest`` answered by a replica's text runner, in its endpoint's shape."""
    try:
        got = await runner.answer(
            request.texts, context, query=request.query if request.kind == "rerank" else None, field=request.field
        )
    except TextRefused as exc:
        code = "request_too_large" if exc.status == 413 else "invalid_value"
        raise ApiError(exc.status, exc.message, param=exc.param, code=code) from None
    if request.kind == "embed":
        values = got.values
        if request.dimensions is not None and request.dimensions != values.shape[1]:
            raise ApiError(
                400,
                f"dimensions {request.dimensions}: model '{request.model}' gives {values.shape[1]}-dimensional "
                "vectors and does not support shortening them (its folder names no Matryoshka training); leave "
                f"dimensions out or give {values.shape[1]}.",
                param="dimensions",
                code="invalid_value",
            )
        return embeddings_reply(request, values, got.tokens, got.truncated)
    if request.kind == "rerank":
        return rerank_reply(request, got.values, got.tokens, got.truncated)
    return classify_reply(request, got.values, runner.model.task.labels, got.tokens, got.truncated)


async def text_dispatch(routes: list[Route], request: Any, context: RequestContext, path: str | None = None) -> Reply:
    """The reply of the text route matching ``request``, as ``http.dispatch`` finds it, but in OpenAI's words:
    a handler's ApiError (and any other exception) goes on to the pipeline, whose ``OpenAIErrors`` answers it,
    and a path or method no route takes is an ApiError 404 / 405."""
    path = path if path is not None else (request.url.path.rstrip("/") or "/")
    found, allowed = find_route(routes, request.method, path)
    if found is not None:
        route, fields = found
        return await route.handler(request, context, **fields)
    if allowed:
        raise ApiError(
            405,
            f"{printable(request.method, 20)} is not allowed on {printable(path)} (use {', '.join(allowed)}).",
            code="method_not_allowed",
        )
    paths = ", ".join(f"POST {ROUTE_PREFIX}{p}" for p in ENDPOINTS)
    raise ApiError(
        404,
        f"No route {printable(request.method, 20)} {printable(path)}: text models answer {paths} and GET "
        f"{ROUTE_PREFIX}/models (or the same under /v2/models/NAME{ROUTE_PREFIX}).",
        code="not_found",
    )


def model_text_routes(replica: Any) -> list[Route]:
    """The OpenAI-style routes a replica answers itself, under ``/v2/models/NAME/v1``: a text model's endpoint
    (the body's ``model`` may be left out) and ``GET .../v1/models`` (the model alone); a model without text
    answers them too, with the 400 that says so and where its tensors go (not a bare 404)."""
    name = replica.name
    base = f"/v2/models/{name}{ROUTE_PREFIX}"

    def endpoint(kind: str) -> Any:
        async def handler(request: Any, context: RequestContext) -> Reply:
            check_model(name, replica.config.text, kind)  # before the body: its answer does not depend on it
            body = await body_of(request, replica.settings.max_request_bytes, replica.settings.request_timeout_s)
            parsed = parse_text_request(kind, body, model=name)
            return await replica.text_answer(parsed, context)

        return handler

    async def models(request: Any, context: RequestContext) -> Reply:
        if not replica.config.text.text:
            raise ApiError(400, no_text(name, replica.config.text), param="model", code="model_not_text")
        return json_answer(200, {"object": "list", "data": [model_object(name, replica.created)]}, model=name)

    routes = [route("POST", base + path, endpoint(kind)) for path, kind in ENDPOINTS.items()]
    return [*routes, route("GET", base + "/models", models)]


def server_text_routes(server: Any) -> list[Route]:
    """The OpenAI-style routes of the server-wide application: every text endpoint, relayed to the model the
    body names, and ``GET /v1/models`` (``/v1/models/NAME``) listing the text models served."""

    def endpoint(kind: str) -> Any:
        async def handler(request: Any, context: RequestContext) -> Reply:
            body = await body_of(request, server.settings.max_request_bytes, server.settings.request_timeout_s)
            parsed = parse_text_request(kind, body)
            try:
                if parsed.model not in server.names:
                    raise ApiError.unknown_model(printable(parsed.model, 80), server.text_names())
                check_model(parsed.model, server.text_facts(parsed.model), kind)
            except ApiError as exc:  # counted under the model it named ("(unknown)" for one not served)
                return exc.reply(parsed.model)
            return await server.relay_text(parsed, context.for_model(parsed.model))

        return handler

    async def models(request: Any, context: RequestContext) -> Reply:
        data = [model_object(n, server.created, _listed(server.text_facts(n))) for n in server.text_names()]
        return json_answer(200, {"object": "list", "data": data})

    async def one_model(request: Any, context: RequestContext, name: str) -> Reply:
        if name not in server.text_names():
            raise ApiError.unknown_model(printable(name, 80), server.text_names())
        return json_answer(200, model_object(name, server.created, _listed(server.text_facts(name))), model=name)

    routes = [route("POST", ROUTE_PREFIX + path, endpoint(kind)) for path, kind in ENDPOINTS.items()]
    return [
        *routes,
        route("GET", ROUTE_PREFIX + "/models", models),
        route("GET", ROUTE_PREFIX + "/models/{name}", one_model),
    ]


def _listed(facts: TextFacts) -> dict[str, Any]:
    return {"task": facts.kind, "endpoint": use_of(facts.kind)}


async def relay(handle: Any, request: TextRequest, context: RequestContext) -> Reply:
    """The answer of a model's replica (``handle``: its application's) to ``request`` before ``context``'s
    deadline; a call its replica died under runs again on another (inference is idempotent). The replica
    answers every request with a ``Reply`` (its refusals too), so no exception of its crosses Ray."""
    for attempt in range(REPLICA_RETRIES + 1):
        response = handle.text_answer.remote(request, context)
        try:
            return await context.within(response)
        except DeadlineExceeded:  # the pipeline's 504; the replica stops too (it has the deadline)
            response.cancel()
            raise
        except (Exception, asyncio.CancelledError) as exc:
            if not replica_gone(exc):
                raise  # a failure of the relay itself (a 500 with the request id), or its client went away
            if attempt < REPLICA_RETRIES:
                await asyncio.sleep(retry_delay_s(attempt))
    raise ApiError(
        503,
        f"Model '{request.model}' has no ready replica now; retry.",
        kind="server_error",
        code="unavailable",
        retry_after_s=1,
    )


# -- KServe v2: BYTES tensors of strings -------------------------------------------------------------------
def is_text_request(feeds: Mapping[str, np.ndarray]) -> bool:
    """Whether an infer request sends strings (any BYTES input): the text route, not the tensor one."""
    return any(v.dtype == object for v in feeds.values())


def text_inputs(feeds: Mapping[str, np.ndarray], kind: str) -> tuple[list[Any], Any]:
    """(texts, query) of an infer request's BYTES inputs: ``text`` ``[N]`` or ``[N, 1]``, and a cross-encoder's
    ``query`` ``[1]``; anything else is an InputError-like ``TextRefused`` naming what the model takes."""
    wanted = {TEXT_INPUT, QUERY_INPUT} if kind == "rerank" else {TEXT_INPUT}
    takes = (
        "'query' (BYTES [1]) and 'text' (BYTES [N] or [N, 1])" if kind == "rerank" else "'text' (BYTES [N] or [N, 1])"
    )
    names = set(feeds)
    if names != wanted or any(v.dtype != object for v in feeds.values()):
        raise TextRefused(
            400,
            f"This text model takes {takes}, got {', '.join(f'{n!r} ({_kind(v)})' for n, v in feeds.items())}; "
            "send the strings as those inputs, or send only the model's tensor inputs.",
        )
    texts = feeds[TEXT_INPUT]
    if not (texts.ndim == 1 or (texts.ndim == 2 and texts.shape[1] == 1)):
        raise TextRefused(400, f"Input 'text' has shape {list(texts.shape)}; send [N] or [N, 1] strings.", TEXT_INPUT)
    query = None
    if kind == "rerank":
        q = feeds[QUERY_INPUT]
        if q.size != 1:
            raise TextRefused(400, f"Input 'query' has shape {list(q.shape)}; send one string ([1]).", QUERY_INPUT)
        query = q.reshape(-1)[0]
    return list(texts.reshape(-1)), query


async def infer_text(
    replica: Any, feeds: Mapping[str, np.ndarray], outputs: Sequence[str] | None, context: RequestContext
) -> Any:
    """The ``InferResult`` of an infer request that sends strings: the text model's values as tensors, or the
    status that refuses it (400 for a model that takes no text, naming what it lacks)."""
    from ortpilot.serve.http import internal_error
    from ortpilot.serve.oip.execution import InferResult

    runner = replica.text
    if runner is None:
        return InferResult.refused(400, no_text(replica.name, replica.config.text))
    try:
        texts, query = text_inputs(feeds, runner.kind)
        answer = await runner.answer(texts, context, query=query, field=TEXT_INPUT)
        return InferResult(text_outputs(runner.kind, answer, outputs))
    except TextRefused as exc:
        return InferResult.refused(exc.status, exc.message)
    except DeadlineExceeded:
        return InferResult.refused(504, context.expired_message())
    except Exception as exc:  # the client gets the request id, the log the traceback
        return InferResult.refused(500, internal_error(f"infer text {replica.name}", exc, context.request_id))


def _kind(value: np.ndarray) -> str:
    return f"BYTES {list(value.shape)}" if value.dtype == object else f"{value.dtype} {list(value.shape)}"


def text_outputs(kind: str, answer: TextAnswer, wanted: Sequence[str] | None) -> dict[str, np.ndarray]:
    """The outputs of a text infer request (those asked for, in this order; an unknown name is a 400)."""
    outputs = {
        VALUE_OUTPUT[kind]: np.asarray(answer.values, dtype=np.float32),
        "tokens": np.asarray(answer.tokens, dtype=np.int64),
        "truncated": np.asarray(answer.truncated, dtype=bool),
    }
    if wanted is None:
        return outputs
    unknown = [n for n in wanted if n not in outputs]
    if unknown:
        raise TextRefused(
            400,
            f"Unknown output name(s) {', '.join(map(repr, unknown))} for text; this model's text outputs are: "
            f"{', '.join(outputs)}.",
        )
    return {n: outputs[n] for n in wanted}


__all__ = [
    "QUERY_INPUT",
    "TEXT_INPUT",
    "VALUE_OUTPUT",
    "answer_text",
    "check_model",
    "infer_text",
    "is_text_request",
    "model_text_routes",
    "no_text",
    "relay",
    "server_text_routes",
    "text_dispatch",
    "text_inputs",
    "text_outputs",
    "wrong_kind",
]
