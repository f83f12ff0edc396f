"""The servicer side of KServe v2 over gRPC: the gRPC form of the request pipeline (``guarded``: the
guard's key check, then the message check, each answering the RPC's empty response with its status),
the HTTP -> gRPC status mapping every deployment answers with, and a base class whose unserved RPCs
are UNIMPLEMENTED rather than Ray's "method does not exist" as UNKNOWN. Ray Serve calls the method
named like the RPC with the request message and ``grpc_context``, and sends back what it returns.
Importing this module imports ``grpc_service``, so every deployment that serves RPCs has its fixes.
"""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable
from typing import Any

from ortpilot.serve.oip.grpc_codec import messages
from ortpilot.serve.oip.grpc_service import MalformedRequest

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


def malformed(request: Any, context: Any) -> bool:
    """Whether ``request`` is a MalformedRequest; if so the status (INVALID_ARGUMENT) is set."""
    if not isinstance(request, MalformedRequest):
        return False
    set_status(
        context,
        400,
        f"The {request.rpc} call's message is not a valid inference.{request.rpc}Request ({request.error}); "
        "send the KServe v2 protobuf message (as tritonclient.grpc does).",
    )
    return True


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


def guarded(*, health: bool = False, count: bool = False) -> Callable[[RpcMethod], RpcMethod]:
    """A servicer method behind the gRPC form of the request pipeline: the guard's key check
    (UNAUTHENTICATED) and the message check (INVALID_ARGUMENT, ``malformed``) run first, and a call
    either stops answers the RPC's empty response message (``NameResponse``). ``health``: open without
    a key unless ``--auth-health``; ``count``: the servicer's ``count_stopped(status)`` counts it."""

    def wrap(method: RpcMethod) -> RpcMethod:
        empty = f"{method.__name__}Response"

        @functools.wraps(method)  # Ray reads the signature (its ``grpc_context`` argument) through the wrapper
        async def rpc(self: Any, request: Any, grpc_context: Any = None) -> Any:
            status = 401 if refused(self.guard, grpc_context, health) else None
            if status is None and malformed(request, grpc_context):
                status = 400
            if status is None:
                return await method(self, request, grpc_context)
            if count:
                self.count_stopped(status)
            return getattr(messages(), empty)()

        return rpc

    return wrap


def _unserved(name: str) -> Any:
    async def rpc(self: Any, request: Any, grpc_context: Any = None) -> Any:
        if not refused(self.guard, grpc_context):
            set_status(grpc_context, 501, f"{name} is not served here; this server answers {', '.join(SERVED_RPCS)}.")
        return getattr(messages(), f"{name}Response")()

    rpc.__name__ = rpc.__qualname__ = name
    return rpc


# A base for the deployments that answer KServe v2 calls: every RPC they do not serve is UNIMPLEMENTED
# (after the key check), not Ray's "method does not exist" as UNKNOWN.
UnservedRpcs = type("UnservedRpcs", (), {name: _unserved(name) for name in UNSERVED_RPCS})


def refused(guard: Any, context: Any, health: bool = False) -> bool:
    """Whether ``guard`` (``guard.Guard``) stops this call; if so the status (UNAUTHENTICATED) is set."""
    verdict = guard.grpc(context, health)
    if verdict is None:
        return False
    set_status(context, verdict.status, verdict.message)
    return True


__all__ = [
    "SERVED_RPCS",
    "STATUS_OF_HTTP",
    "UNSERVED_RPCS",
    "UnservedRpcs",
    "guarded",
    "malformed",
    "refused",
    "set_status",
]
