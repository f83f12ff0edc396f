"""serve.openai without Ray: a decoder replica's events, and the ingress (pipeline, routes, JSON and SSE
answers, drain) in front of it through an in-process handle, on the demo decoder's real ORT session."""

from __future__ import annotations

import asyncio
import json

import pytest
from local_handle import LocalHandle
from unit_requests import body, request

from ortpilot.serve.access import access_options
from ortpilot.serve.openai.decoder import DecoderReplica
from ortpilot.serve.openai.ingress import OpenAIIngress
from ortpilot.serve.openai.spec import prepare_decoder
from ortpilot.serve.openai.wire import DecodeEvent, GenerationRequest, parse_request
from ortpilot.serve.options import DecoderOptions, ServeOptions, ServerOptions

pytest.importorskip("prometheus_client")


@pytest.fixture(scope="module")
def replica():
    spec = prepare_decoder("demo:decoder", "d", DecoderOptions(max_streams=2, max_queue=2, max_length=64))
    replica = DecoderReplica(spec, 1)
    yield replica
    replica.close()


def _ingress(replica, **access) -> OpenAIIngress:
    server = ServerOptions(access=access_options(**access))
    return OpenAIIngress({"d": LocalHandle(replica)}, server.requests(ServeOptions(access_log=False)))


def test_the_replica_yields_start_deltas_and_end(replica):
    req = parse_request("completion", json.dumps({"model": "d", "prompt": "hello", "max_tokens": 5}).encode())

    async def events():
        return [e async for e in replica.generate(req)]

    out = asyncio.run(events())
    assert out[0] == DecodeEvent("start", prompt_tokens=5) and out[-1].type == "end"
    assert out[-1].completion_tokens == 5 and all(e.type == "delta" and e.text for e in out[1:-1])


def test_a_prompt_without_room_is_one_error_event(replica):
    req = GenerationRequest("completion", "d", prompt="x" * 80, max_tokens=4)

    async def events():
        return [e async for e in replica.generate(req)]

    (event,) = asyncio.run(events())
    assert event.type == "error" and event.status == 400 and event.message, event


def test_a_completion_through_the_ingress(replica):
    ingress = _ingress(replica)
    doc = {"model": "d", "prompt": "hi", "max_tokens": 4, "temperature": 0}
    response = asyncio.run(ingress(request("POST", "/v1/completions", doc)))
    answer = body(response)
    assert response.status_code == 200, answer
    assert answer["object"] == "text_completion" and answer["usage"]["completion_tokens"] == 4
    assert ingress.in_flight == 0
    listed = body(asyncio.run(ingress(request("GET", "/v1/models"))))
    assert [m["id"] for m in listed["data"]] == ["d"]
    one = body(asyncio.run(ingress(request("GET", "/v1/models/d"))))
    assert "pid" not in one["ortpilot"] and one["ortpilot"]["max_streams"] == 2  # pid only with --debug-info


def test_a_streamed_chat_ends_with_done_and_frees_its_count(replica):
    ingress = _ingress(replica)
    doc = {"model": "d", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3, "stream": True}

    async def stream():
        response = await ingress(request("POST", "/v1/chat/completions", doc))
        assert ingress.in_flight == 1  # a stream counts until it ends
        return response, [chunk async for chunk in response.body_iterator]

    response, chunks = asyncio.run(stream())
    text = b"".join(c if isinstance(c, bytes) else c.encode() for c in chunks).decode()
    assert response.status_code == 200 and response.media_type == "text/event-stream"
    assert text.rstrip().endswith("data: [DONE]") and '"chat.completion.chunk"' in text
    assert ingress.in_flight == 0


@pytest.mark.parametrize(
    "method, path, doc, status, code",
    [
        ("POST", "/v1/completions", {"model": "nope", "prompt": "x"}, 404, "model_not_found"),
        ("POST", "/v1/completions", {"model": "d", "prompt": "x", "logit_bias": {"1": 2}}, 400, "unsupported"),
        ("GET", "/v1/completions", None, 405, "method_not_allowed"),
        ("GET", "/v1/nowhere", None, 404, "not_found"),
        ("POST", "/metrics", None, 405, "method_not_allowed"),
    ],
)
def test_errors_in_openais_shape(replica, method, path, doc, status, code):
    response = asyncio.run(_ingress(replica)(request(method, path, doc)))
    error = body(response)["error"]
    assert response.status_code == status and error["code"] == code and error["message"], error


def test_keys_health_metrics_and_drain(replica):
    ingress = _ingress(replica, api_keys=["k"])
    refused = asyncio.run(ingress(request("GET", "/v1/models")))
    assert refused.status_code == 401 and body(refused)["error"]["code"] == "invalid_api_key"
    assert asyncio.run(ingress(request("GET", "/v2/health/live"))).status_code == 200  # open without a key
    ready = asyncio.run(ingress(request("GET", "/v2/health/ready")))
    assert ready.status_code == 503  # no replica has reported a heartbeat here
    key = {"authorization": "Bearer k"}
    asyncio.run(ingress(request("POST", "/v1/completions", {"model": "d", "prompt": "x", "max_tokens": 2}, key)))
    metrics = bytes(asyncio.run(ingress(request("GET", "/metrics", headers=key))).body).decode()
    assert 'code="200"' in metrics and 'model="d"' in metrics
    asyncio.run(ingress.drain())
    draining = asyncio.run(ingress(request("GET", "/v1/models", headers=key)))
    assert draining.status_code == 503 and draining.headers["retry-after"] == "1"


def test_what_a_replica_sends_the_ingress_is_typed(replica):
    from ortpilot.serve.openai.info import DecoderInfo
    from ortpilot.serve.openai.metrics import EngineCounters

    asyncio.run(_ingress(replica)(request("POST", "/v1/completions", {"model": "d", "prompt": "hi", "max_tokens": 2})))
    counters = EngineCounters.of_engine(replica.scheduler.counters())
    assert counters.requests >= 1 and counters.completion_tokens >= 2 and counters.ttft_seconds.buckets[-1][0] == "+Inf"
    info = replica.describe()
    assert isinstance(info, DecoderInfo) and info.engine.max_streams == 2
    assert DecoderInfo.from_dict(info.to_dict()) == info and "pid" not in info.public_dict()


@pytest.mark.parametrize("stream", [False, True])
def test_a_generation_past_its_deadline_in_the_queue_is_504_and_never_run(replica, stream):
    """The engine is held busy (a request's token callback waits on the engine thread); a request with a
    0.3 s X-Request-Timeout waits in the queue meanwhile: 504 in OpenAI's shape (a stream too: it had not
    started), and once the engine goes on it never prefills a token of it."""
    import threading
    import time

    hold, entered = threading.Event(), threading.Event()

    def busy(_stream, token):
        if token is not None:
            entered.set()
            hold.wait(30)

    blocker = replica.scheduler.submit([72, 105], 3, on_token=busy)
    assert entered.wait(30)
    before = replica.scheduler.counters()
    headers = {"x-request-timeout": "0.3", "x-request-id": "late-1"}
    doc = {"model": "d", "prompt": "queued behind a busy engine", "max_tokens": 4, "stream": stream}

    async def main():
        try:
            response = await _ingress(replica)(request("POST", "/v1/completions", doc, headers))
        finally:
            hold.set()
        deadline = time.monotonic() + 30  # this loop stays open until the engine retired both requests
        while (replica.scheduler.pending or not blocker.done) and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        return response

    response = asyncio.run(main())
    after = replica.scheduler.counters()
    error = body(response)["error"]
    assert response.status_code == 504, error
    assert error["code"] == "timeout" and error["type"] == "server_error" and "deadline of 0.3 s" in error["message"]
    assert after["requests"] == before["requests"] + 1 and after["prefill_tokens"] == before["prefill_tokens"]
    assert sum(after["finished"].values()) == sum(before["finished"].values()) + 2  # the blocker, and it unrun
    assert after["completion_tokens"] == before["completion_tokens"] + 2  # the blocker's two tokens left, no more


class DeploymentUnavailableError(Exception):
    """Named like Ray Serve's: the deployment has no replica (starting, or every one of them gone)."""


class _NoReplica(LocalHandle):
    @property
    def describe(self):
        async def describe():
            raise DeploymentUnavailableError("none")

        return type("Method", (), {"remote": staticmethod(describe)})()


def test_a_model_with_no_replica_up_is_503_on_its_models_route_not_a_500(replica):
    # serve's own readiness wait polls GET /v1/models/NAME: each poll of a decoder still starting was a 500
    # logged with its traceback
    server = ServerOptions()
    ingress = OpenAIIngress({"d": _NoReplica(replica)}, server.requests(ServeOptions(access_log=False)))
    response = asyncio.run(ingress(request("GET", "/v1/models/d")))
    assert response.status_code == 503 and response.headers["retry-after"] == "1"
    assert body(response)["error"]["code"] == "unavailable"
