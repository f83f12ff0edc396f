"""KServe v2 over gRPC (``inference.GRPCInferenceService``) as Ray Serve runs it: the servicer
registration Ray's gRPC options name (``add_servicer``: a message that does not parse reaches the
method as a ``MalformedRequest``), the proxy callback, the driver's own ``ModelReady`` probe, and
Ray's process-local fixes. The messages and their codec are ``grpc_codec``; the servicer methods'
guard wrapper and status mapping ``grpc_rpcs``.

Importing this module (Ray does, in the proxy through ``proxy_callback``, and every replica and
the server-wide application do) applies three process-local fixes: tritonclient's messages name
their module ``grpc_service_pb2``, which Ray's classic proxy must resolve to pickle them; Ray
binds every Serve gRPC server on all interfaces (``[::]:PORT``: the KServe servers and the one
between deployments), which a loopback server moves onto 127.0.0.1 (the serve core's
``loopback.install``, which the OpenAI stack's replicas run too); and Ray's proxy refuses a call without ``application``
metadata once two applications exist (a model's and the server-wide one), so such a call is for
``ORTPILOT_GRPC_APP`` (the one model, or the server-wide application, which relays by model
name), the rule HAProxy's frontend applies too (``fastpath``). These patch private Ray
functions, by name; the serve tests check every port a server opens and calls without metadata
on both ingress paths.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ortpilot.serve import loopback
from ortpilot.serve.fastpath import GRPC_APP_ENV

SERVICER = "ortpilot.serve.oip.grpc_service.add_servicer"
PROXY_CALLBACK = "ortpilot.serve.oip.grpc_service:proxy_callback"


def _install() -> None:
    from ortpilot.serve.oip.grpc_codec import messages

    pb = messages()
    sys.modules.setdefault("grpc_service_pb2", pb)
    _name_unnamed_calls(os.environ.get(GRPC_APP_ENV, ""))
    loopback.install()


def _name_unnamed_calls(app: str) -> None:
    """In Ray's proxy: a gRPC call that sends no ``application`` metadata is routed as if it named ``app``."""
    if not app:
        return
    try:
        from ray.serve._private.proxy_request_response import gRPCProxyRequest
    except ImportError:
        return
    setup = gRPCProxyRequest.setup_variables
    if getattr(setup, "_ortpilot_app", False):
        return

    def setup_variables(self: Any) -> None:
        setup(self)
        if not self.app_name and not self.is_route_request and not self.is_health_request:
            self.app_name = app

    setup_variables._ortpilot_app = True  # type: ignore[attr-defined]
    gRPCProxyRequest.setup_variables = setup_variables


@dataclass(frozen=True)
class MalformedRequest:
    """What a call whose message does not parse carries instead of it (gRPC would answer it UNKNOWN,
    naming protobuf's DecodeError, before any servicer method runs): the method sees this and answers
    INVALID_ARGUMENT after its key check (``malformed``)."""

    rpc: str
    error: str


def _lenient(rpc: str, handler: Any) -> Any:
    """``handler`` whose request deserializer gives a MalformedRequest where protobuf cannot parse the bytes."""
    parse = handler.request_deserializer
    if parse is None:
        return handler

    def deserialize(data: bytes) -> Any:
        from google.protobuf.message import DecodeError

        try:
            return parse(data)
        except DecodeError as exc:
            return MalformedRequest(rpc, str(exc).splitlines()[0][:200] if str(exc) else "DecodeError")

    return handler._replace(request_deserializer=deserialize)


class _LenientServer:
    """The gRPC server as the generated registration sees it: every handler it adds gets ``_lenient``."""

    def __init__(self, server: Any) -> None:
        self._server = server

    def add_generic_rpc_handlers(self, handlers: Any) -> None:
        for handler in handlers:  # grpc's generic handler; Ray's server reads the same private dict
            handler._method_handlers = {
                path: _lenient(path.rpartition("/")[2], h) for path, h in handler._method_handlers.items()
            }
        self._server.add_generic_rpc_handlers(handlers)

    def add_registered_method_handlers(self, service: str, handlers: dict[str, Any]) -> None:
        self._server.add_registered_method_handlers(service, {m: _lenient(m, h) for m, h in handlers.items()})

    def __getattr__(self, name: str) -> Any:
        return getattr(self._server, name)


def add_servicer(servicer: Any, server: Any) -> None:
    """What ``grpc_options.grpc_servicer_functions`` names: registers the KServe v2 service, with request
    messages that do not parse handed to the servicer as ``MalformedRequest``."""
    from tritonclient.grpc import service_pb2_grpc

    service_pb2_grpc.add_GRPCInferenceServiceServicer_to_server(servicer, _LenientServer(server))


def model_ready(address: str, name: str, metadata: Mapping[str, str], timeout: float = 2.0) -> bool:
    """Whether ``ModelReady(name)`` at ``address`` answers ready with ``metadata`` (the driver's own check:
    HAProxy learns the gRPC routes on a reload of its own, after the REST ones may already answer)."""
    import grpc
    from tritonclient.grpc import service_pb2_grpc

    from ortpilot.serve.oip.grpc_codec import messages

    with grpc.insecure_channel(address) as channel:
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
        try:
            reply = stub.ModelReady(
                messages().ModelReadyRequest(name=name),
                timeout=timeout,
                metadata=[(k.lower(), v) for k, v in metadata.items()],
            )
        except grpc.RpcError:
            return False
    return bool(reply.ready)


def proxy_callback() -> list:
    """``RAY_SERVE_HTTP_PROXY_CALLBACK_IMPORT_PATH``: imported in the proxy before its gRPC server binds
    (so the fixes above apply there); adds no HTTP middleware."""
    return []


_install()

__all__ = [
    "PROXY_CALLBACK",
    "SERVICER",
    "MalformedRequest",
    "add_servicer",
    "model_ready",
    "proxy_callback",
]
