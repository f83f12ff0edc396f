"""One model replica: a verified session that answers its model's requests itself, REST and gRPC.

The constructor is the gate: it loads the profile strictly with intra-op threads set to the
replica's CPUs (Ray sets ``OMP_NUM_THREADS``, which ORT ignores), reproduces the reference
outputs (``tune.verify.verify_profile``) and raises when they differ, so Ray never routes a
request to a replica that did not verify; a restarted replica goes through the same gate.

A replica is its model's own Serve application (route prefix ``/v2/models/NAME``): HAProxy, or
Ray's proxy, hands it the request directly (``__call__`` for REST, the KServe v2 method for gRPC,
both through the request pipeline), one hop. How it runs the model is
``execution`` (one run thread, dynamic batching); what it tells the server-wide application,
``reporting``.
"""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

import numpy as np

from ortpilot.errors import InputError
from ortpilot.serve.context import DeadlineExceeded, RequestContext, new_request_id
from ortpilot.serve.counts import RequestCounts
from ortpilot.serve.errorbody import OIP
from ortpilot.serve.http import (
    BodyError,
    Reply,
    dispatch,
    error_reply,
    internal_error,
    read_body,
    replica_logging,
)
from ortpilot.serve.oip.config import Batching, ReplicaConfig
from ortpilot.serve.oip.execution import InferResult, ModelRunner, load_verified, thread_note
from ortpilot.serve.oip.grpc_codec import decode_infer, encode_infer, messages, model_metadata, server_metadata
from ortpilot.serve.oip.grpc_rpcs import GrpcStatus, UnservedRpcs, guarded
from ortpilot.serve.oip.replicainfo import ReplicaInfo
from ortpilot.serve.oip.reporting import Reporter
from ortpilot.serve.oip.routes import OipErrors, unknown_here
from ortpilot.serve.oip.textroutes import (
    answer_text,
    infer_text,
    is_text_request,
    model_text_routes,
    no_text,
    text_dispatch,
)
from ortpilot.serve.oip.textrunner import TextRunner, text_model
from ortpilot.serve.openaiapi import ApiError, OpenAIErrors
from ortpilot.serve.options import ModelSpec, ort_threads
from ortpilot.serve.pipeline import Pipeline, RpcReply
from ortpilot.serve.textwire import ROUTE_PREFIX, TextRequest

OPENAI_ERRORS = OpenAIErrors()


class ModelReplica(UnservedRpcs):
    """The model deployment's class (Ray Serve wraps it; called directly, it needs no Ray: the unit tests)."""

    def __init__(self, spec: ModelSpec, config: ReplicaConfig) -> None:
        started = time.perf_counter()
        from ortpilot.serve.oip.routes import model_routes

        replica_logging()

        self.spec = spec
        self.config = config
        self.name = spec.name
        self.cpus = float(config.cpus)
        self.threads = ort_threads(self.cpus)
        self.session, verification = load_verified(spec, self.threads, config.accept_machine)
        self.runner = ModelRunner(spec.name, self.session, config)
        self.batching = self.runner.batching
        self.text = _text_runner(spec, self.session, config, self.runner)  # None: the model takes tensors only
        self.created = int(time.time())
        self.requests = RequestCounts()
        self.replica_id = _replica_id()
        self.settings = config.requests
        self.debug_info = config.requests.debug_info
        self.pipeline = Pipeline(config.requests, OipErrors(), self._observe, spec.name, GrpcStatus(), spec.name)
        self.guard = self.pipeline.guard
        self.info = self._info(verification, started)
        self.reporter = Reporter(spec.name, self.replica_id, config.server_app)
        self.routes = model_routes(self)
        self.text_routes = model_text_routes(self)  # a model without text answers them with a 400 that says so
        self.text_prefix = f"/v2/models/{spec.name}{ROUTE_PREFIX}/"

    def _info(self, verification: Mapping[str, Any], started: float) -> ReplicaInfo:
        """What this replica verified and runs with (its heartbeat carries it; clients see ``public_dict``)."""
        placement = self.session.placement
        return ReplicaInfo(
            replica=self.replica_id,
            model=self.spec.name,
            verified=True,
            verification=verification["mode"],
            why=verification["why"],
            providers=tuple(self.session.providers),
            placement_share=({p: round(placement.share(p), 6) for p in placement.counts} if placement else {}),
            intra_op_threads=self.threads,
            cpus=self.cpus,
            profile_intra_op_threads=verification["profile_threads"],
            threads_note=thread_note(self.threads, verification["profile_threads"], profile=verification["profile"]),
            batching=Batching(self.config.max_batch, self.config.batch_wait_ms) if self.batching else None,
            node=_node_id(),
            host=socket.gethostname(),
            pid=os.getpid(),
            load_s=round(time.perf_counter() - started, 3),
            session_create_s=round(getattr(self.session, "create_s", 0.0), 4),
            optimized_model=verification["optimized_model"],
        )

    # -- REST ---------------------------------------------------------------------------------------
    async def __call__(self, request: Any) -> Any:
        """One HTTP request for this model (the full path: ``/v2/models/NAME/...``), through the pipeline; a text
        model's OpenAI-style routes (``/v2/models/NAME/v1/...``) answer in OpenAI's shape."""
        if self.text_routes and request.url.path.startswith(self.text_prefix):
            return await self.pipeline.handle(
                request, lambda context: text_dispatch(self.text_routes, request, context), shape=OPENAI_ERRORS
            )
        return await self.pipeline.handle(request, lambda context: dispatch(self.routes, request, context))

    def _observe(self, request: Any, reply: Reply | RpcReply, seconds: float) -> None:
        """The pipeline's count: every answer (REST or gRPC) in this replica's requests, reported now and then."""
        self.requests.observe(reply.status, seconds)
        self._report(soon=True)

    async def read_body(self, request: Any) -> bytes | Reply:
        """The request body, or a 413 reply when it is over ``--max-request-mb``, or a 408 when it does not
        arrive within the request timeout."""
        try:
            return await read_body(request, self.settings.max_request_bytes, self.settings.request_timeout_s)
        except BodyError as exc:
            return error_reply(exc.status, exc.message)

    async def metadata(self) -> dict[str, Any]:
        """The model's metadata: tensors, and what each live replica verified (details with --debug-info)."""
        replicas = await self.replica_infos()
        text = (
            {"text": replace(self.config.text, dim=self.text.dim).public_dict(self.text.limit)}
            if self.text is not None
            else {}
        )
        return {
            "name": self.name,
            "versions": ["1"],
            "platform": "onnxruntime_onnx",
            "inputs": [t.to_dict() for t in self.config.inputs],
            "outputs": [t.to_dict() for t in self.config.outputs],
            "ortpilot": {**self.config.facts.to_dict(), "ready": True, "replicas": replicas, **text},
        }

    async def replica_infos(self) -> list[dict[str, Any]]:
        """Every live replica's info as the server-wide application holds it (this one's when it cannot),
        as model metadata shows it (no process details without --debug-info)."""
        infos = await self.reporter.replica_infos() or [self.info]
        return [i.to_dict() if self.debug_info else i.public_dict() for i in infos]

    # -- gRPC (KServe v2): every RPC through the pipeline (``guarded``: key check, message check, count, log) --
    @guarded(health=True)
    async def ServerLive(self, request: Any, grpc_context: Any, context: RequestContext) -> RpcReply:
        return RpcReply(messages().ServerLiveResponse(live=True))  # RPCs carry KServe v2 names

    @guarded(health=True)
    async def ServerReady(self, request: Any, grpc_context: Any, context: RequestContext) -> RpcReply:
        return RpcReply(messages().ServerReadyResponse(ready=True))

    @guarded()
    async def ServerMetadata(self, request: Any, grpc_context: Any, context: RequestContext) -> RpcReply:
        """The server's metadata: a call without ``application`` metadata comes here when one model is served."""
        return RpcReply(server_metadata())

    @guarded()
    async def ModelReady(self, request: Any, grpc_context: Any, context: RequestContext) -> RpcReply:
        ready = request.name == self.name and request.version in ("", "1")
        return RpcReply(messages().ModelReadyResponse(ready=ready), model=self.name)

    @guarded()
    async def ModelMetadata(self, request: Any, grpc_context: Any, context: RequestContext) -> RpcReply:
        return self.metadata_message(request)

    @guarded()
    async def ModelInfer(self, request: Any, grpc_context: Any, context: RequestContext) -> RpcReply:
        """KServe v2 ModelInfer: the same checks and outputs as REST infer; errors as gRPC status codes."""
        return await self.infer_message(request, context)

    def metadata_message(self, request: Any) -> RpcReply:
        """The ModelMetadataResponse of a ModelMetadataRequest (NOT_FOUND for another model or version):
        what ModelMetadata answers here, and what the server-wide application relays."""
        if request.name != self.name or request.version not in ("", "1"):
            return RpcReply(None, 404, unknown_here(request.name, request.version), self.name)
        return RpcReply(model_metadata(self.name, self.config.inputs, self.config.outputs), model=self.name)

    async def infer_message(self, request: Any, context: RequestContext | None = None) -> RpcReply:
        """The ModelInferResponse of a ModelInferRequest, or the status that refuses it: what ModelInfer
        answers here, and what the server-wide application relays for clients that name no application,
        with the call's ``context`` (the pipeline that takes the call counts it, not this method)."""
        if request.model_name != self.name or request.model_version not in ("", "1"):
            return RpcReply(None, 404, unknown_here(request.model_name, request.model_version), self.name)
        ident = context.request_id if context is not None else None
        try:
            feeds, outputs = decode_infer(request, self.settings.max_request_bytes)
            result = await self.infer(feeds, outputs, context)
        except InputError as exc:
            result = InferResult.refused(400, str(exc))
        except Exception as exc:  # the client gets the request id, the log the traceback
            result = InferResult.refused(500, internal_error(f"gRPC ModelInfer {self.name}", exc, ident))
        if not result.ok:
            return RpcReply(None, result.status, result.error, self.name)
        return RpcReply(encode_infer(self.name, result.outputs, request.id), model=self.name)

    # -- requests -----------------------------------------------------------------------------------
    async def infer(
        self,
        feeds: Mapping[str, np.ndarray],
        outputs: Sequence[str] | None = None,
        context: RequestContext | None = None,
    ) -> InferResult:
        """The outputs of ``feeds`` before ``context``'s deadline (``execution.ModelRunner.infer``), or the
        status and message that refuse them; strings (BYTES inputs) go to the text model (``textroutes``)."""
        if is_text_request(feeds):
            context = context or RequestContext(new_request_id(), OIP, None, model=self.name)
            return await infer_text(self, feeds, outputs, context)
        return await self.runner.infer(feeds, outputs, context)

    async def text_answer(self, request: TextRequest, context: RequestContext) -> Reply:
        """A checked OpenAI-style text request (``serve.textwire``), answered by this replica's text model: what
        its own ``/v2/models/NAME/v1`` routes answer, and what the server-wide application relays for
        ``/v1/...``. Every outcome is a ``Reply`` in OpenAI's shape (a refusal too), so none raises across Ray."""
        context = context.for_model(self.name)
        try:
            if self.text is None:
                raise ApiError(400, no_text(self.name, self.config.text), param="model", code="model_not_text")
            return await answer_text(self.text, request, context)
        except ApiError as exc:
            return exc.reply(self.name)
        except DeadlineExceeded:
            return ApiError.expired(context).reply(self.name)
        except Exception as exc:  # the client gets the request id, the log the traceback
            message = internal_error(f"{request.kind} {self.name}", exc, context.request_id)
            return ApiError(500, message, kind="server_error").reply(self.name)

    def describe(self) -> ReplicaInfo:
        return self.info

    async def check_health(self) -> None:
        """Ray's health check, every few seconds: also the heartbeat that tells the server-wide application
        this replica is alive and verified (it only exists once the constructor's verification passed).
        Async: a throughput-optimized replica's handles work only on its event loop."""
        self._report()

    def _report(self, soon: bool = False) -> None:
        """Hand the server-wide application this replica's state (``soon``: unless it did lately)."""
        text = self.text.counts if self.text is not None else None
        self.reporter.report(self.info, self.runner.counts, self.requests, text, soon=soon)


def _text_runner(spec: ModelSpec, session: Any, config: ReplicaConfig, runner: ModelRunner) -> TextRunner | None:
    """The text side of a text model's replica (its TextModel on the verified session, the run thread shared
    with tensor requests), checked with one text before the replica takes traffic; None for other models."""
    if not config.text.text:
        return None
    model = text_model(spec, session, config.text, config.text_options)
    return TextRunner(model, config.text_options, runner.executor, config.batch_wait_ms / 1000.0, spec.name)


def _replica_id() -> str:
    try:
        from ray import serve

        return serve.get_replica_context().replica_id.unique_id
    except Exception:
        return f"pid-{os.getpid()}"


def _node_id() -> str:
    """The Ray node this replica runs on; "" outside Ray. Asked only of an initialized Ray: in a process
    without one, ``get_runtime_context`` initializes Ray itself, joining ``RAY_ADDRESS`` or the cluster
    this machine started last, and waits for that cluster's GCS without end when it is gone (a unit test
    hung there under pytest-xdist once the other worker's Ray had stopped)."""
    try:
        import ray

        return ray.get_runtime_context().get_node_id() if ray.is_initialized() else ""
    except Exception:
        return ""


__all__ = ["ModelReplica"]
