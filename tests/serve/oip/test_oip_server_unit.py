"""serve.oip.server and serve.oip.routes without Ray: the server-wide application's own answers (health,
metadata, unknown models, models with no ready replica, /metrics), called directly."""

from __future__ import annotations

import asyncio

import grpc
import pytest
from unit_requests import GrpcContext, body, request

from ortpilot.serve.access import access_options
from ortpilot.serve.oip.grpc_codec import messages
from ortpilot.serve.oip.grpc_service import MalformedRequest
from ortpilot.serve.oip.metrics import UNKNOWN_MODEL
from ortpilot.serve.oip.server import ServerApp
from ortpilot.serve.options import ServeOptions, ServerOptions

pytest.importorskip("prometheus_client")


def _server(**access) -> ServerApp:
    server = ServerOptions(access=access_options(**access))
    return ServerApp({"a": "a", "b": "b"}, server.requests(ServeOptions(access_log=False)))


def test_health_and_metadata():
    app = _server()
    assert body(asyncio.run(app(request("GET", "/v2/health/live")))) == {"live": True}
    ready = asyncio.run(app(request("GET", "/v2/health/ready")))
    assert ready.status_code == 503 and body(ready) == {"ready": False, "models": {"a": False, "b": False}}
    assert body(asyncio.run(app(request("GET", "/v2"))))["name"] == "ortpilot"
    index = body(asyncio.run(app(request("POST", "/v2/repository/index"))))
    assert [m["state"] for m in index] == ["UNAVAILABLE", "UNAVAILABLE"]


def test_unknown_models_and_models_without_replicas():
    app = _server()
    unknown = asyncio.run(app(request("POST", "/v2/models/zzz/infer", {"inputs": []})))
    assert unknown.status_code == 404 and body(unknown)["error"] == "Unknown model 'zzz'. This server serves: a, b."
    starting = asyncio.run(app(request("POST", "/v2/models/a/infer", {"inputs": []})))
    assert starting.status_code == 503 and starting.headers["retry-after"] == "1"
    assert "starting or restarting" in body(starting)["error"]
    asyncio.run(app.drain())
    draining = asyncio.run(app(request("GET", "/v2/models/a")))
    assert "draining" in body(draining)["error"]
    text = bytes(asyncio.run(app(request("GET", "/metrics"))).body).decode()
    assert 'ortpilot_requests_total{code="404",model="(unknown)"}' in text
    assert 'ortpilot_requests_total{code="503",model="a"} 2.0' in text


def test_a_refused_request_is_counted_under_the_unknown_model_and_health_stays_open():
    app = _server(api_keys=["k"])
    refused = asyncio.run(app(request("GET", "/v2")))
    assert refused.status_code == 401 and body(refused)["error"].startswith("Missing API key")
    assert asyncio.run(app(request("GET", "/v2/health/live"))).status_code == 200
    assert app.metrics.local_requests(UNKNOWN_MODEL).codes == {"401": 1}


def test_grpc_server_calls_and_the_guard_wrapper():
    app = _server(api_keys=["k"])
    keyed = {"authorization": "Bearer k"}
    context = GrpcContext(keyed)
    assert asyncio.run(app.ServerMetadata(messages().ServerMetadataRequest(), context)).name == "ortpilot"
    ready = GrpcContext()  # health is open without a key
    assert asyncio.run(app.ServerReady(messages().ServerReadyRequest(), ready)).ready is False
    assert ready.code is None
    for call, req, ctx, code in (
        (app.ModelInfer, messages().ModelInferRequest(model_name="a"), GrpcContext(), grpc.StatusCode.UNAUTHENTICATED),
        (app.ModelInfer, MalformedRequest("ModelInfer", "x"), GrpcContext(keyed), grpc.StatusCode.INVALID_ARGUMENT),
        (app.ModelInfer, messages().ModelInferRequest(model_name="zzz"), GrpcContext(keyed), grpc.StatusCode.NOT_FOUND),
        (
            app.ModelMetadata,
            MalformedRequest("ModelMetadata", "x"),
            GrpcContext(keyed),
            grpc.StatusCode.INVALID_ARGUMENT,
        ),
    ):
        asyncio.run(call(req, ctx))
        assert ctx.code == code, ctx.details
    # Every call goes through the pipeline: refusals and the unknown model count under (unknown).
    assert app.metrics.local_requests(UNKNOWN_MODEL).codes == {"401": 1, "400": 2, "404": 1}
    asyncio.run(app.drain())
    draining = GrpcContext(keyed)
    asyncio.run(app.ModelMetadata(messages().ModelMetadataRequest(name="a"), draining))
    assert draining.code == grpc.StatusCode.UNAVAILABLE and "draining" in draining.details
    assert app.metrics.local_requests("a").codes == {"503": 1}


def test_a_heartbeat_makes_its_model_ready_and_counts_in_metrics():
    from ortpilot.serve.counts import RequestSnapshot
    from ortpilot.serve.oip.metrics import BatchCounts, Heartbeat
    from ortpilot.serve.oip.replicainfo import ReplicaInfo

    app = _server()
    batches = BatchCounts()
    batches.observe(2)
    info = ReplicaInfo(
        "r1", "a", verified=True, providers=("CPUExecutionProvider",), placement_share={"CPUExecutionProvider": 1.0}
    )
    asyncio.run(app.report(Heartbeat("a", "r1", info, batches.snapshot(), RequestSnapshot({"200": 3}, count=3))))
    assert app.ready("a") and not app.ready("b")
    assert asyncio.run(app.replica_infos("a")) == [info]
    text = bytes(asyncio.run(app(request("GET", "/metrics"))).body).decode()
    assert 'ortpilot_requests_total{code="200",model="a"} 3.0' in text
    assert 'ortpilot_placement_share{model="a",provider="CPUExecutionProvider"} 1.0' in text
    stale = Heartbeat("a", "r1", info, BatchCounts().snapshot(), RequestSnapshot())
    asyncio.run(app.report(stale))  # an older report that arrives late replaces no newer count
    assert (
        'ortpilot_requests_total{code="200",model="a"} 3.0'
        in bytes(asyncio.run(app(request("GET", "/metrics"))).body).decode()
    )
