"""The servicer side of KServe v2 over gRPC: the one guard wrapper (``guarded``: every servicer method
goes through its deployment's request pipeline, ``pipeline.Pipeline.call``: key check, message check,
error mapping, count, access log), how gRPC words the pipeline's answers (``GrpcStatus``: the HTTP ->
gRPC status mapping every deployment answers with), and a base class whose unserved RPCs are
UNIMPLEMENTED rather than Ray's "method does not exist" as UNKNOWN. Ray Serve calls the method
named like the RPC with the request message and ``grpc_context``, and sends back what it returns.
Importing this module imports ``grpc_service``, so every deployment that serves RPCs has its fixes.
"""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable
from typing import Any

from ortpilot.serve.oip.grpc_codec import messages
from ortpilot.serve.oip.grpc_service import MalformedRequest
from ortpilot.serve.pipeline import RpcReply

RpcMethod = Callable[..., Awaitable[Any]]

# The gRPC status of each HTTP status a handler chose (KServe's mapping, as Triton answers).
STATUS_OF_HTTP = {
    400: "INVALID_ARGUMENT",
    401: "UNAUTHENTICATED",
    403: "PERMISSION_DENIED",
    404: "NOT_FOUND",
    408: "DEADLINE_EXCEEDED",
    501: "UNIMPLEMENTED",
    413: "RESOURCE_EXHAUSTED",
    429: "RESOURCE_EXHAUSTED",
    503: "UNAVAILABLE",
    504: "DEADLINE_EXCEEDED",
}


def set_status(context: Any, http_status: int, message: str) -> None:
    """Set ``context``'s gRPC status from the HTTP status a handler chose (INTERNAL for other 5xx)."""
    import grpc

    if context is None or http_status == 200:
        return
    code = STATUS_OF_HTTP.get(http_status, "INTERNAL" if http_status >= 500 else "UNKNOWN")
    context.set_code(getattr(grpc.StatusCode, code))
    context.set_details(message.splitlines()[0][:1000] if message else code)


def malformed(request: Any) -> str | None:
    """Why ``request`` is no KServe v2 message (a ``MalformedRequest``: INVALID_ARGUMENT), else None."""
    if not isinstance(request, MalformedRequest):
        return None
    return (
        f"The {request.rpc} call's message is not a valid inference.{request.rpc}Request ({request.error}); "
        "send the KServe v2 protobuf message (as tritonclient.grpc does)."
    )


class GrpcStatus:
    """The pipeline's ``RpcShape`` for KServe v2: the message check, the status mapping, the empty response."""

    def invalid(self, request: Any) -> str | None:
        return malformed(request)

    def set_status(self, context: Any, status: int, message: str) -> None:
        set_status(context, status, message)

    def empty(self, rpc: str) -> Any:
        return getattr(messages(), f"{rpc}Response")()


SERVED_RPCS = ("ServerLive", "ServerReady", "ModelReady", "ServerMetadata", "ModelMetadata", "ModelInfer")
# The unary RPCs of inference.GRPCInferenceService a server does not serve (ModelStreamInfer streams: left out).
UNSERVED_RPCS = (
    "ModelConfig",
    "ModelStatistics",
    "RepositoryIndex",
    "RepositoryModelLoad",
    "RepositoryModelUnload",
    "SystemSharedMemoryStatus",
    "SystemSharedMemoryRegister",
    "SystemSharedMemoryUnregister",
    "CudaSharedMemoryStatus",
    "CudaSharedMemoryRegister",
    "CudaSharedMemoryUnregister",
    "TraceSetting",
    "LogSettings",
)


def guarded(*, health: bool = False) -> Callable[[RpcMethod], RpcMethod]:
    """A servicer method ``(self, request, grpc_context, context)`` (returning a ``pipeline.RpcReply``)
    behind its deployment's request pipeline (``self.pipeline.call``): the key check (UNAUTHENTICATED)
    and the message check (INVALID_ARGUMENT) first, then the method with the call's ``RequestContext``,
    its status set, counted and logged. Ray calls the wrapper as the RPC, ``(request, grpc_context)``.
    ``health``: open without a key unless ``--auth-health``."""

    def wrap(method: RpcMethod) -> RpcMethod:
        name = method.__name__

        @functools.wraps(method)  # Ray reads the signature (its ``grpc_context`` argument) through the wrapper
        async def rpc(self: Any, request: Any, grpc_context: Any = None) -> Any:
            return await self.pipeline.call(
                name, request, grpc_context, lambda context: method(self, request, grpc_context, context), health=health
            )

        return rpc

    return wrap


def _unserved(name: str) -> Any:
    async def rpc(self: Any, request: Any, grpc_context: Any, context: Any) -> RpcReply:
        return RpcReply(None, 501, f"{name} is not served here; this server answers {', '.join(SERVED_RPCS)}.")

    rpc.__name__ = rpc.__qualname__ = name
    return guarded()(rpc)


# A base for the deployments that answer KServe v2 calls: every RPC they do not serve is UNIMPLEMENTED
# (after the key check), not Ray's "method does not exist" as UNKNOWN.
UnservedRpcs = type("UnservedRpcs", (), {name: _unserved(name) for name in UNSERVED_RPCS})


__all__ = [
    "SERVED_RPCS",
    "STATUS_OF_HTTP",
    "UNSERVED_RPCS",
    "GrpcStatus",
    "UnservedRpcs",
    "guarded",
    "malformed",
    "set_status",
]
