"""KServe v2 over gRPC (``inference.GRPCInferenceService``): the servicer Ray Serve registers, and
protobuf messages <-> numpy with the same checks as the REST codec.

The messages are tritonclient's generated ones, so ``tritonclient.grpc`` works unchanged.
Ray Serve's gRPC support calls the deployment's method named like the RPC with the request
message and sends back the message it returns; ``grpc_context`` sets the status code.
Tensor data comes as ``raw_input_contents`` (one little-endian buffer per input, decoded with
``np.frombuffer``, no copy) or as the typed ``contents`` lists; outputs go back raw.

Importing this module (Ray does, in the proxy through ``proxy_callback``, and every replica and
the server-wide application do) applies three process-local fixes: tritonclient's messages name
their module ``grpc_service_pb2``, which Ray's classic proxy must resolve to pickle them; Ray
binds every Serve gRPC server on all interfaces (``[::]:PORT``: the KServe servers and the one
between deployments), which a loopback server moves onto 127.0.0.1 (``ORTPILOT_GRPC_LOOPBACK=1``
in the controller's environment); and Ray's proxy refuses a call without ``application``
metadata once two applications exist (a model's and the server-wide one), so such a call is for
``ORTPILOT_GRPC_APP`` (the one model, or the server-wide application, which relays by model
name), the rule HAProxy's frontend applies too (``fastpath``). These patch three private Ray
functions, by name; the serve tests check every port a server opens and calls without metadata
on both ingress paths.
"""

from __future__ import annotations

import functools
import math
import os
import sys
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ortpilot.errors import InputError
from ortpilot.serve.fastpath import GRPC_APP_ENV, GRPC_LOOPBACK_ENV
from ortpilot.serve.oip.codec import DATATYPE_OF, MAX_DIM, MAX_RANK, NUMPY_OF
from ortpilot.serve.oip.config import TensorSpec

RpcMethod = Callable[..., Awaitable[Any]]
SERVICER = "ortpilot.serve.oip.grpc_service.add_servicer"
PROXY_CALLBACK = "ortpilot.serve.oip.grpc_service:proxy_callback"
# The typed field of InferTensorContents each datatype travels in (FP16/BF16 only travel raw).
CONTENTS_FIELD = {
    "BOOL": "bool_contents",
    "INT8": "int_contents",
    "INT16": "int_contents",
    "INT32": "int_contents",
    "INT64": "int64_contents",
    "UINT8": "uint_contents",
    "UINT16": "uint_contents",
    "UINT32": "uint_contents",
    "UINT64": "uint64_contents",
    "FP32": "fp32_contents",
    "FP64": "fp64_contents",
}


def messages() -> Any:
    """tritonclient's generated KServe v2 messages (``service_pb2``)."""
    from tritonclient.grpc import service_pb2

    return service_pb2


def _install() -> None:
    pb = messages()
    sys.modules.setdefault("grpc_service_pb2", pb)
    _name_unnamed_calls(os.environ.get(GRPC_APP_ENV, ""))
    if os.environ.get(GRPC_LOOPBACK_ENV) != "1":
        return
    try:
        import ray.serve._private.default_impl as impl
        import ray.serve._private.replica as replica
    except ImportError:
        return
    impl.add_grpc_address = _on_loopback(impl.add_grpc_address)  # the proxies' and replicas' KServe servers
    replica.add_port_to_grpc_server = _on_loopback(replica.add_port_to_grpc_server)  # between deployments


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


def _on_loopback(bind: Any) -> Any:
    """``bind(server, address)`` with Ray's all-interface ``[::]:PORT`` turned into ``127.0.0.1:PORT``."""
    if getattr(bind, "_ortpilot_loopback", False):
        return bind

    def on_loopback(server: Any, address: str) -> Any:
        if address.startswith("[::]:"):
            address = "127.0.0.1:" + address[len("[::]:") :]
        return bind(server, address)

    on_loopback._ortpilot_loopback = True  # type: ignore[attr-defined]
    return on_loopback


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


def server_metadata() -> Any:
    """The ServerMetadataResponse every deployment answers (the same as REST ``GET /v2``)."""
    from ortpilot.serve.oip.routes import EXTENSIONS
    from ortpilot.version import __version__

    return messages().ServerMetadataResponse(name="ortpilot", version=__version__, extensions=EXTENSIONS)


def model_ready(address: str, name: str, metadata: Mapping[str, str], timeout: float = 2.0) -> bool:
    """Whether ``ModelReady(name)`` at ``address`` answers ready with ``metadata`` (the driver's own check:
    HAProxy learns the gRPC routes on a reload of its own, after the REST ones may already answer)."""
    import grpc
    from tritonclient.grpc import service_pb2_grpc

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


def decode_infer(request: Any, max_bytes: int) -> tuple[dict[str, np.ndarray], list[str] | None]:
    """(feeds, the outputs asked for) of a ModelInferRequest; an InputError names what is wrong."""
    raw = list(request.raw_input_contents)
    if raw and len(raw) != len(request.inputs):
        raise InputError(
            f"The request has {len(request.inputs)} inputs but {len(raw)} raw_input_contents: send one "
            "buffer per input, in order, or the typed contents."
        )
    feeds: dict[str, np.ndarray] = {}
    for i, tensor in enumerate(request.inputs):
        name = tensor.name
        if name in feeds:
            raise InputError(f"Input '{name}' is given twice in the request.")
        shape = list(tensor.shape)
        if len(shape) > MAX_RANK or not all(0 <= d <= MAX_DIM for d in shape):
            raise InputError(f"Input '{name}' needs a shape of at most {MAX_RANK} non-negative dims, got {shape}.")
        if tensor.datatype not in NUMPY_OF:
            raise InputError(
                f"Input '{name}' has datatype {tensor.datatype!r}, which this server does not decode; it takes "
                f"{', '.join(NUMPY_OF)}."
            )
        dtype = NUMPY_OF[tensor.datatype]
        needed = math.prod(shape) * dtype.itemsize
        if needed > max_bytes:
            raise InputError(f"Input '{name}' has shape {shape}: {needed} bytes, over the limit of {max_bytes}.")
        feeds[name] = _tensor(name, tensor, raw[i] if raw else None, dtype, shape, needed)
    outputs = [o.name for o in request.outputs] or None
    return feeds, outputs


def _tensor(name: str, tensor: Any, raw: bytes | None, dtype: np.dtype, shape: list[int], needed: int) -> np.ndarray:
    if raw is not None:
        if len(raw) != needed:
            raise InputError(
                f"Input '{name}' carries {len(raw)} raw bytes; shape {shape} of {tensor.datatype} needs {needed}."
            )
        return np.frombuffer(raw, dtype=dtype).reshape(shape)
    field_name = CONTENTS_FIELD.get(tensor.datatype)
    if field_name is None:
        raise InputError(f"Input '{name}' is {tensor.datatype}: send it as raw_input_contents.")
    values = getattr(tensor.contents, field_name)
    if len(values) != math.prod(shape):
        raise InputError(f"Input '{name}' has {len(values)} values, but shape {shape} needs {math.prod(shape)}.")
    try:
        return np.asarray(values, dtype=dtype).reshape(shape)
    except (OverflowError, ValueError) as exc:
        raise InputError(f"Input '{name}' data cannot be read as {tensor.datatype} ({exc}).") from None


def encode_infer(model: str, outputs: Mapping[str, np.ndarray], request_id: str = "") -> Any:
    """The ModelInferResponse: every output raw (as tritonclient reads them), in the model's order."""
    pb = messages()
    response = pb.ModelInferResponse(model_name=model, model_version="1", id=request_id)
    for name, value in outputs.items():
        value = np.ascontiguousarray(value)
        response.outputs.add(name=name, datatype=DATATYPE_OF.get(value.dtype, str(value.dtype)), shape=value.shape)
        response.raw_output_contents.append(value.tobytes())
    return response


def model_metadata(name: str, inputs: Sequence[TensorSpec], outputs: Sequence[TensorSpec]) -> Any:
    pb = messages()
    tensor = pb.ModelMetadataResponse.TensorMetadata
    return pb.ModelMetadataResponse(
        name=name,
        versions=["1"],
        platform="onnxruntime_onnx",
        inputs=[tensor(name=t.name, datatype=t.datatype, shape=list(t.shape)) for t in inputs],
        outputs=[tensor(name=t.name, datatype=t.datatype, shape=list(t.shape)) for t in outputs],
    )


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


_install()

__all__ = [
    "CONTENTS_FIELD",
    "PROXY_CALLBACK",
    "SERVED_RPCS",
    "SERVICER",
    "UNSERVED_RPCS",
    "MalformedRequest",
    "UnservedRpcs",
    "add_servicer",
    "decode_infer",
    "encode_infer",
    "guarded",
    "malformed",
    "messages",
    "model_metadata",
    "proxy_callback",
    "refused",
    "server_metadata",
    "set_status",
]
