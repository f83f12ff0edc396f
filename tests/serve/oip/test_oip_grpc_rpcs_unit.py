"""serve.oip.grpc_rpcs: the guard wrapper keeps the signature Ray Serve reads (it passes ``grpc_context``
only to a method whose signature names it), every HTTP status a handler chooses maps to the gRPC code
Triton answers, and every unserved RPC of the KServe v2 service is UNIMPLEMENTED."""

from __future__ import annotations

import inspect

import grpc
import pytest
from tritonclient.grpc import service_pb2_grpc
from unit_requests import GrpcContext

from ortpilot.serve.oip.grpc_rpcs import SERVED_RPCS, UNSERVED_RPCS, UnservedRpcs, set_status
from ortpilot.serve.oip.replica import ModelReplica
from ortpilot.serve.oip.server import ServerApp


@pytest.mark.parametrize("cls", [ModelReplica, ServerApp])
def test_every_served_rpc_keeps_the_grpc_context_parameter(cls):
    for name in SERVED_RPCS:
        params = inspect.signature(getattr(cls, name)).parameters
        assert list(params)[:3] == ["self", "request", "grpc_context"], (cls.__name__, name)


def test_served_and_unserved_rpcs_cover_the_unary_service():
    rpcs = {n for n in dir(service_pb2_grpc.GRPCInferenceServiceServicer) if not n.startswith("_")}
    assert rpcs - {"ModelStreamInfer"} == set(SERVED_RPCS) | set(UNSERVED_RPCS)
    assert all(callable(getattr(UnservedRpcs, n)) for n in UNSERVED_RPCS)


@pytest.mark.parametrize(
    "http, code",
    [(400, "INVALID_ARGUMENT"), (401, "UNAUTHENTICATED"), (404, "NOT_FOUND"), (413, "RESOURCE_EXHAUSTED")]
    + [(429, "RESOURCE_EXHAUSTED"), (503, "UNAVAILABLE"), (504, "DEADLINE_EXCEEDED"), (500, "INTERNAL")],
)
def test_http_statuses_map_to_grpc_codes(http, code):
    context = GrpcContext()
    set_status(context, http, "first line\nsecond line")
    assert context.code == getattr(grpc.StatusCode, code) and context.details == "first line"


def test_a_200_sets_no_status():
    context = GrpcContext()
    set_status(context, 200, "")
    assert context.code is None
