"""The server-wide application (route prefix ``/``): what no single model answers.

Health (``/v2/health/*``), server metadata (``/v2``), the repository index, ``/metrics`` summed
over every replica of every model (they report here), and an answer for every path no model
application claims: 404 for an unknown model, 503 with Retry-After for a known model that has
no ready replica (starting, restarting, or the server draining after SIGTERM); and the text models'
OpenAI-style routes (``/v1/embeddings``, ``/v1/rerank``, ``/v1/classify``, ``/v1/models``), each request
relayed to the model its body names (``textroutes``). Over gRPC it
answers the server-wide calls, and relays a model's calls by the model's name for clients that
send no ``application`` header while several models are served (one more hop; a client that
sends ``application: NAME`` goes to the model directly). One replica, no CPUs of its own.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from ortpilot.serve.context import DeadlineExceeded, RequestContext
from ortpilot.serve.defaults import REPLICA_RETRIES, retry_delay_s
from ortpilot.serve.http import Reply, dispatch, replica_gone, replica_logging
from ortpilot.serve.oip.grpc_codec import messages, server_metadata
from ortpilot.serve.oip.grpc_rpcs import GrpcStatus, UnservedRpcs, guarded
from ortpilot.serve.oip.metrics import UNKNOWN_MODEL, Heartbeat, ServeMetrics
from ortpilot.serve.oip.replicainfo import ReplicaInfo
from ortpilot.serve.oip.routes import (
    HEALTH,
    RETRY_AFTER_S,
    OipErrors,
    no_replica,
    server_routes,
    unclaimed,
    unknown_model,
)
from ortpilot.serve.oip.textroutes import relay, server_text_routes, text_dispatch
from ortpilot.serve.openaiapi import ApiError, OpenAIErrors
from ortpilot.serve.pipeline import Pipeline, RpcReply
from ortpilot.serve.records import RequestSettings
from ortpilot.serve.textfacts import TextFacts
from ortpilot.serve.textwire import ROUTE_PREFIX, TextRequest

OPENAI_ERRORS = OpenAIErrors()

SERVER_APP = "ortpilot"
SERVER_DEPLOYMENT = "ortpilot-server"


class ServerApp(UnservedRpcs):
    """The server-wide deployment's class (Ray Serve wraps it)."""

    def __init__(
        self, models: Mapping[str, str], settings: RequestSettings, text: Mapping[str, TextFacts] | None = None
    ) -> None:

        replica_logging()

        self.names = list(models)  # served model name -> its application's name
        self.apps = dict(models)
        self.settings = settings
        self.text = {n: f if isinstance(f, TextFacts) else TextFacts.from_dict(f) for n, f in (text or {}).items()}
        self.created = int(time.time())
        self.metrics = ServeMetrics(self.names)
        self.routes = server_routes(self)
        self.text_routes = server_text_routes(self)
        self.draining = False
        self.pipeline = Pipeline(settings, OipErrors(), self._observe, UNKNOWN_MODEL, GrpcStatus())
        self.guard = self.pipeline.guard
        self._handles: dict[str, Any] = {}

    async def __call__(self, request: Any) -> Any:
        path = request.url.path.rstrip("/") or "/"
        if path == ROUTE_PREFIX or path.startswith(ROUTE_PREFIX + "/"):  # text models' OpenAI-style routes
            return await self.pipeline.handle(
                request, lambda context: text_dispatch(self.text_routes, request, context, path), shape=OPENAI_ERRORS
            )
        return await self.pipeline.handle(
            request, lambda context: self._route(request, path, context), health=path in HEALTH
        )

    async def _route(self, request: Any, path: str, context: RequestContext) -> Reply:
        return unclaimed(self, path) or await dispatch(self.routes, request, context, path)

    def _observe(self, request: Any, reply: Reply | RpcReply, seconds: float) -> None:
        """The pipeline's count (REST and gRPC): answers about a model, and every 5xx whatever it concerned;
        a relayed gRPC call is counted here, not by the replica that answered it."""
        if reply.model is not None or reply.status >= 500:
            self.metrics.observe(reply.model or UNKNOWN_MODEL, reply.status, seconds)

    # -- text models ---------------------------------------------------------------------------------
    def text_names(self) -> list[str]:
        """The served models that take text (``GET /v1/models`` lists them)."""
        return [n for n in self.names if self.text_facts(n).text]

    def text_facts(self, name: str) -> TextFacts:
        return self.text.get(name) or TextFacts(missing=f"the server knows nothing of the text of model '{name}'")

    async def relay_text(self, request: TextRequest, context: RequestContext) -> Reply:
        """A checked text request relayed to one of its model's replicas (``textroutes.relay``)."""
        if self.draining:
            raise ApiError(
                503,
                no_replica(request.model, "the server is draining"),
                kind="server_error",
                code="unavailable",
                retry_after_s=RETRY_AFTER_S,
            )
        return await relay(self._handle(request.model), request, context)

    # -- what the replicas tell it ------------------------------------------------------------------
    def ready(self, name: str) -> bool:
        return bool(self.metrics.replicas(name)) and not self.draining

    async def report(self, beat: Heartbeat) -> None:
        """A model replica's heartbeat: who it is, what it verified, its cumulative counts."""
        self.metrics.report(beat)

    async def replica_infos(self, name: str) -> list[ReplicaInfo]:
        """What each live verified replica of model ``name`` reported (model metadata lists them)."""
        return [r.info for r in self.metrics.replicas(name)]

    async def drain(self) -> None:
        """SIGTERM: from now on every model path no replica claims is a 503 with Retry-After."""
        self.draining = True

    # -- gRPC (KServe v2): every RPC through the pipeline (``guarded``: key check, message check, count, log) --
    @guarded(health=True)
    async def ServerLive(self, request: Any, grpc_context: Any, context: RequestContext) -> RpcReply:
        return RpcReply(messages().ServerLiveResponse(live=True))  # RPCs carry KServe v2 names

    @guarded(health=True)
    async def ServerReady(self, request: Any, grpc_context: Any, context: RequestContext) -> RpcReply:
        ready = all(self.ready(n) for n in self.names) and not self.draining
        return RpcReply(messages().ServerReadyResponse(ready=ready))

    @guarded()
    async def ServerMetadata(self, request: Any, grpc_context: Any, context: RequestContext) -> RpcReply:
        return RpcReply(server_metadata())

    @guarded()
    async def ModelReady(self, request: Any, grpc_context: Any, context: RequestContext) -> RpcReply:
        ready = request.name in self.apps and self.ready(request.name)
        return RpcReply(messages().ModelReadyResponse(ready=ready), model=request.name)

    @guarded()
    async def ModelMetadata(self, request: Any, grpc_context: Any, context: RequestContext) -> RpcReply:
        """Relay a call that named no application to its model's replicas."""
        return await self._relay(request.name, context, lambda handle: handle.metadata_message.remote(request))

    @guarded()
    async def ModelInfer(self, request: Any, grpc_context: Any, context: RequestContext) -> RpcReply:
        """Relay a call that named no application to its model, again on another replica if its replica died;
        the replica gets the call's context (its id and deadline)."""
        call = context.for_model(request.model_name)
        return await self._relay(request.model_name, call, lambda handle: handle.infer_message.remote(request, call))

    async def _relay(self, name: str, context: RequestContext, send: Callable[[Any], Awaitable[RpcReply]]) -> RpcReply:
        """What model ``name``'s replica answers to ``send(handle)`` before ``context``'s deadline (NOT_FOUND
        for a model not served, UNAVAILABLE when it has no replica); a call its replica died under runs again
        elsewhere, as inference and metadata are idempotent. Ray's error text never reaches the client."""
        handle = self._model(name)
        if isinstance(handle, RpcReply):
            return handle
        for attempt in range(REPLICA_RETRIES + 1):
            response = send(handle)
            try:
                return await context.within(response)
            except DeadlineExceeded:  # the pipeline's 504; the replica stops too (it has the deadline)
                response.cancel()
                raise
            except (Exception, asyncio.CancelledError) as exc:
                if isinstance(exc, asyncio.CancelledError) and not replica_gone(exc):
                    raise  # this call itself was cancelled: its client went away
                if not (replica_gone(exc) and attempt < REPLICA_RETRIES):
                    break
                await asyncio.sleep(retry_delay_s(attempt))
        return RpcReply(None, 503, no_replica(name), name)

    def _model(self, name: str) -> Any:
        """The handle of model ``name``'s application, or the RpcReply that refuses the call (404, 503)."""
        if name not in self.apps:
            return RpcReply(None, 404, unknown_model(name, self.names), UNKNOWN_MODEL)
        if self.draining:
            return RpcReply(None, 503, no_replica(name, "the server is draining"), name)
        return self._handle(name)

    def _handle(self, name: str) -> Any:
        """The Serve handle of model ``name``'s application (made once)."""
        if name not in self._handles:
            from ray import serve

            self._handles[name] = serve.get_app_handle(self.apps[name])
        return self._handles[name]


__all__ = ["SERVER_APP", "SERVER_DEPLOYMENT", "ServerApp"]
