"""serve.pipeline: guard -> route -> error mapping -> CORS headers -> count -> access log, in that order,
for any protocol's error shape (driven with in-process requests, no Ray)."""

from __future__ import annotations

import asyncio
import json

from unit_requests import request

from ortpilot.serve.access import access_options
from ortpilot.serve.http import Reply, error_reply, json_reply
from ortpilot.serve.oip.routes import OipErrors
from ortpilot.serve.openaiapi import OpenAIErrors
from ortpilot.serve.pipeline import Pipeline
from ortpilot.serve.records import RequestSettings

ORIGIN = "https://app.example"


def _pipeline(shape, seen, access_log=False, **access) -> Pipeline:
    policy = access_options(**access).policy("127.0.0.1")
    settings = RequestSettings(access=policy, access_log=access_log)
    return Pipeline(settings, shape, lambda req, reply, s: seen.append((reply.status, reply.model)), "(unknown)")


def test_a_refused_request_never_reaches_its_route_and_is_counted():
    seen, routed = [], []

    async def route(context) -> Reply:
        routed.append(1)
        return json_reply(200, {})

    pipe = _pipeline(OipErrors(), seen, api_keys=["k"])
    response = asyncio.run(pipe.handle(request("GET", "/v2"), route))
    assert response.status_code == 401 and json.loads(response.body)["error"].startswith("Missing API key")
    assert not routed and seen == [(401, "(unknown)")]
    ok = asyncio.run(pipe.handle(request("GET", "/v2", headers={"authorization": "Bearer k"}), route))
    assert ok.status_code == 200 and routed == [1]
    assert asyncio.run(pipe.handle(request("GET", "/v2/health/live"), route, health=True)).status_code == 200


def test_a_failing_route_is_a_500_in_each_protocols_shape_with_a_request_id(caplog):
    async def route(context) -> Reply:
        raise RuntimeError("secret internals")

    for shape, message in ((OipErrors(), lambda d: d["error"]), (OpenAIErrors(), lambda d: d["error"]["message"])):
        seen: list = []
        response = asyncio.run(_pipeline(shape, seen).handle(request("POST", "/x"), route))
        text = message(json.loads(response.body))
        assert response.status_code == 500 and "request id" in text and "secret" not in text
        assert seen == [(500, None)]
    assert "secret internals" in caplog.text  # the log has it, once per failure


def test_cors_headers_on_every_answer_to_an_allowed_origin_and_a_preflight_is_204():
    seen: list = []
    pipe = _pipeline(OipErrors(), seen, cors_origins=[ORIGIN])

    async def route(context) -> Reply:
        return error_reply(404, "nothing here")

    answer = asyncio.run(pipe.handle(request("GET", "/x", headers={"origin": ORIGIN}), route))
    assert answer.status_code == 404 and answer.headers["access-control-allow-origin"] == ORIGIN
    preflight = {"origin": ORIGIN, "access-control-request-method": "POST"}
    assert asyncio.run(pipe.handle(request("OPTIONS", "/x", headers=preflight), route)).status_code == 204
    other = asyncio.run(pipe.handle(request("GET", "/x", headers={"origin": "https://evil.example"}), route))
    assert other.status_code == 403 and "access-control-allow-origin" not in other.headers
    assert seen == [(404, None), (204, None), (403, "(unknown)")]


def test_an_openai_api_error_raised_by_a_route_is_its_own_answer():
    from ortpilot.serve.openai.wire import ApiError

    async def route(context) -> Reply:
        raise ApiError(429, "busy", kind="rate_limit_error", code="rate_limit_exceeded", retry_after_s=1)

    response = asyncio.run(_pipeline(OpenAIErrors(), []).handle(request("POST", "/v1/completions"), route))
    assert response.status_code == 429 and response.headers["retry-after"] == "1"
    assert json.loads(response.body)["error"]["code"] == "rate_limit_exceeded"


def test_one_access_log_line_per_request_never_the_payload(capfd):
    async def route(context) -> Reply:
        return json_reply(200, {"secret": "payload"})

    asyncio.run(_pipeline(OipErrors(), [], access_log=True).handle(request("POST", "/v2/x", {"a": 1}), route))
    err = capfd.readouterr().err
    assert err.count('"POST /v2/x" 200') == 1 and "payload" not in err


class _Status:
    """A stand-in ``RpcShape``: a message is invalid when it is the string "bad"."""

    def invalid(self, request):
        return "not a message" if request == "bad" else None

    def set_status(self, context, status, message):
        context.code, context.details = status, message

    def empty(self, rpc):
        return f"empty {rpc}"


def test_a_grpc_call_takes_the_same_steps_guard_check_route_errors_count_and_log(capfd):
    from unit_requests import GrpcContext

    from ortpilot.serve.pipeline import RpcReply

    seen: list = []
    pipe = Pipeline(
        RequestSettings(access=access_options(api_keys=["k"]).policy("127.0.0.1"), access_log=True),
        OipErrors(),
        lambda req, reply, s: seen.append((reply.status, reply.model)),
        "(unknown)",
        _Status(),
    )
    keyed = {"authorization": "Bearer k"}

    async def ok(context) -> RpcReply:
        return RpcReply("answer", model="m")

    async def boom(context) -> RpcReply:
        raise RuntimeError("secret internals")

    contexts = [GrpcContext(), GrpcContext(keyed), GrpcContext(keyed), GrpcContext(keyed), GrpcContext()]
    answers = [
        asyncio.run(pipe.call("Infer", "msg", contexts[0], ok)),  # no key: refused, never routed
        asyncio.run(pipe.call("Infer", "bad", contexts[1], ok)),  # the message check
        asyncio.run(pipe.call("Infer", "msg", contexts[2], ok)),
        asyncio.run(pipe.call("Infer", "msg", contexts[3], boom)),  # a failing route: 500 with a request id
        asyncio.run(pipe.call("Live", "msg", contexts[4], ok, health=True)),  # health: open without a key
    ]
    assert answers == ["empty Infer", "empty Infer", "answer", "empty Infer", "answer"]
    assert [c.code for c in contexts] == [401, 400, 200, 500, 200]
    assert "request id" in contexts[3].details and "secret" not in contexts[3].details
    assert seen == [(401, "(unknown)"), (400, "(unknown)"), (200, "m"), (500, None), (200, "m")]
    lines = [ln for ln in capfd.readouterr().err.splitlines() if '"gRPC ' in ln]
    assert [ln.split('"')[2].split()[0] for ln in lines] == ["401", "400", "200", "500", "200"]


def test_every_route_gets_the_requests_context():
    from ortpilot.serve.context import RequestContext

    seen: list[RequestContext] = []

    async def route(context) -> Reply:
        seen.append(context)
        return json_reply(200, {})

    settings = RequestSettings(request_timeout_s=30)
    pipe = Pipeline(settings, OipErrors(), None, "m", model="m")
    given = asyncio.run(pipe.handle(request("GET", "/v2", headers={"x-request-id": "trace-1"}), route))
    made = asyncio.run(pipe.handle(request("GET", "/v2", headers={"x-request-timeout": "2"}), route))
    assert given.status_code == made.status_code == 200
    assert seen[0].request_id == "trace-1" and seen[0].model == "m" and seen[0].protocol == "oip"
    assert seen[0].timeout_s == 30 and seen[1].timeout_s == 2 and not seen[1].expired


def test_a_header_the_context_cannot_take_is_a_400_in_each_protocols_shape_before_the_route():
    routed: list[int] = []

    async def route(context) -> Reply:
        routed.append(1)
        return json_reply(200, {})

    shapes = ((OipErrors(), lambda d: d["error"]), (OpenAIErrors(), lambda d: d["error"]["message"]))
    for shape, message in shapes:
        for header, value in (("x-request-id", "a b"), ("x-request-timeout", "-3")):
            seen: list = []
            bad = request("POST", "/x", headers={header: value})
            response = asyncio.run(_pipeline(shape, seen).handle(bad, route))
            text = message(json.loads(response.body))
            assert response.status_code == 400 and f"{header.title()} '{value}'" in text, text
            assert [status for status, _model in seen] == [400]
    assert not routed


def test_a_missed_deadline_is_a_504_in_each_protocols_shape(caplog):
    from ortpilot.serve.context import DeadlineExceeded

    async def route(context) -> Reply:
        raise DeadlineExceeded(context)

    for shape, error in ((OipErrors(), lambda d: d["error"]), (OpenAIErrors(), lambda d: d["error"])):
        seen: list = []
        slow = request("POST", "/x", headers={"x-request-timeout": "1.5", "x-request-id": "r-9"})
        response = asyncio.run(_pipeline(shape, seen).handle(slow, route))
        body = error(json.loads(response.body))
        assert response.status_code == 504 and seen == [(504, None)]
        text = body if isinstance(body, str) else body["message"]
        assert "within its deadline of 1.5 s" in text and "X-Request-Timeout" in text
        if not isinstance(body, str):
            assert body["type"] == "server_error" and body["code"] == "timeout"
    assert "failed" not in caplog.text  # not a server failure: no traceback logged


def test_a_grpc_calls_context_comes_from_its_metadata():
    from unit_requests import GrpcContext

    from ortpilot.serve.context import DeadlineExceeded
    from ortpilot.serve.pipeline import RpcReply

    pipe = Pipeline(RequestSettings(request_timeout_s=30), OipErrors(), None, "(unknown)", _Status(), "m")
    seen: list = []

    async def ok(context) -> RpcReply:
        seen.append(context)
        return RpcReply("answer", model="m")

    async def late(context) -> RpcReply:
        raise DeadlineExceeded(context)

    traced = GrpcContext({"x-request-id": "g-1", "x-request-timeout": "4"})
    assert asyncio.run(pipe.call("Infer", "msg", traced, ok)) == "answer"
    assert seen[0].request_id == "g-1" and seen[0].timeout_s == 4 and seen[0].model == "m"
    expired, refused = GrpcContext(), GrpcContext({"x-request-timeout": "later"})
    assert asyncio.run(pipe.call("Infer", "msg", expired, late)) == "empty Infer"
    assert expired.code == 504 and "deadline of 30 s" in expired.details  # DEADLINE_EXCEEDED
    asyncio.run(pipe.call("Infer", "msg", refused, ok))
    assert refused.code == 400 and "X-Request-Timeout 'later'" in refused.details and len(seen) == 1
    odd = GrpcContext({"x-request-id": "a b"})
    asyncio.run(pipe.call("Infer", "msg", odd, ok))
    assert odd.code == 400 and "X-Request-Id 'a b'" in odd.details and len(seen) == 1


def test_a_request_may_take_another_protocols_error_shape_than_its_entry_point():
    """A text model's OpenAI routes on an Open Inference Protocol replica: refusals, failures and the context
    speak OpenAI's API (serve.openaiapi), the entry point's other routes keep their own shape."""
    from ortpilot.serve.errorbody import OPENAI
    from ortpilot.serve.openaiapi import ApiError

    protocols = []

    async def route(context) -> Reply:
        protocols.append(context.protocol)
        raise ApiError(400, "bad input", param="input", code="invalid_value")

    pipe = _pipeline(OipErrors(), [], api_keys=["k"])
    refused = asyncio.run(pipe.handle(request("POST", "/v1/embeddings"), route, shape=OpenAIErrors()))
    assert refused.status_code == 401 and json.loads(refused.body)["error"]["type"] == "invalid_request_error"
    keyed = {"authorization": "Bearer k"}
    failed = asyncio.run(pipe.handle(request("POST", "/v1/embeddings", headers=keyed), route, shape=OpenAIErrors()))
    assert failed.status_code == 400 and json.loads(failed.body)["error"]["param"] == "input"
    assert protocols == [OPENAI]
    oip = asyncio.run(pipe.handle(request("POST", "/v2/x"), route))
    assert json.loads(oip.body)["error"].startswith("Missing API key")
