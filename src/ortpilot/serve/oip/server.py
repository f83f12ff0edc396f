"""The server-wide application (route prefix ``/``): what no single model answers.

Health (``/v2/health/*``), server metadata (``/v2``), the repository index, ``/metrics`` summed
over every replica of every model (they report here), and an answer for every path no model
application claims: 404 for an unknown model, 503 with Retry-After for a known model that has
no ready replica (starting, restarting, or the server draining after SIGTERM). Over gRPC it
answers the server-wide calls, and relays a model's calls by the model's name for clients that
send no ``application`` header while several models are served (one more hop; a client that
sends ``application: NAME`` goes to the model directly). One replica, no CPUs of its own.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping
from typing import Any

from ortpilot.serve.defaults import REPLICA_RETRIES, retry_delay_s
from ortpilot.serve.http import Reply, dispatch, replica_gone, replica_logging
from ortpilot.serve.oip.grpc_codec import messages, server_metadata
from ortpilot.serve.oip.grpc_rpcs import UnservedRpcs, guarded, set_status
from ortpilot.serve.oip.metrics import UNKNOWN_MODEL, Heartbeat, ServeMetrics
from ortpilot.serve.oip.routes import HEALTH, OipErrors, no_replica, server_routes, unclaimed, unknown_model
from ortpilot.serve.pipeline import Pipeline
from ortpilot.serve.records import RequestSettings

SERVER_APP = "ortpilot"
SERVER_DEPLOYMENT = "ortpilot-server"


class ServerApp(UnservedRpcs):
    """The server-wide deployment's class (Ray Serve wraps it)."""

    def __init__(self, models: Mapping[str, str], settings: RequestSettings) -> None:

        replica_logging()

        self.names = list(models)  # served model name -> its application's name
        self.apps = dict(models)
        self.settings = settings
        self.metrics = ServeMetrics(self.names)
        self.routes = server_routes(self)
        self.draining = False
        self.pipeline = Pipeline(settings, OipErrors(), self._observe, refused_model=UNKNOWN_MODEL)
        self.guard = self.pipeline.guard
        self._handles: dict[str, Any] = {}

    async def __call__(self, request: Any) -> Any:
        path = request.url.path.rstrip("/") or "/"
        return await self.pipeline.handle(request, lambda: self._route(request, path), health=path in HEALTH)

    async def _route(self, request: Any, path: str) -> Reply:
        return unclaimed(self, path) or await dispatch(self.routes, request, path)

    def _observe(self, request: Any, reply: Reply, seconds: float) -> None:
        """The pipeline's count: answers about a model, and every 5xx whatever it concerned."""
        if reply.model is not None or reply.status >= 500:
            self.metrics.observe(reply.model or UNKNOWN_MODEL, reply.status, seconds)

    # -- what the replicas tell it ------------------------------------------------------------------
    def ready(self, name: str) -> bool:
        return bool(self.metrics.replicas(name)) and not self.draining

    async def report(self, beat: Heartbeat) -> None:
        """A model replica's heartbeat: who it is, what it verified, its cumulative counts."""
        self.metrics.report(beat)

    async def replica_infos(self, name: str) -> list[dict[str, Any]]:
        return [dict(r.info) for r in self.metrics.replicas(name)]

    async def drain(self) -> None:
        """SIGTERM: from now on every model path no replica claims is a 503 with Retry-After."""
        self.draining = True

    # -- gRPC (KServe v2): every RPC behind ``guarded`` (key check, message check) ----------------------
    @guarded(health=True)
    async def ServerLive(self, request: Any, grpc_context: Any = None) -> Any:  # RPC methods carry KServe v2 names
        return messages().ServerLiveResponse(live=True)

    @guarded(health=True)
    async def ServerReady(self, request: Any, grpc_context: Any = None) -> Any:
        return messages().ServerReadyResponse(ready=all(self.ready(n) for n in self.names) and not self.draining)

    @guarded()
    async def ServerMetadata(self, request: Any, grpc_context: Any = None) -> Any:
        return server_metadata()

    @guarded()
    async def ModelReady(self, request: Any, grpc_context: Any = None) -> Any:
        return messages().ModelReadyResponse(ready=request.name in self.apps and self.ready(request.name))

    @guarded()
    async def ModelMetadata(self, request: Any, grpc_context: Any = None) -> Any:
        handle = self._model(request.name, grpc_context)
        if handle is None:
            return messages().ModelMetadataResponse()
        try:
            return await handle.ModelMetadata.remote(request)
        except Exception:
            set_status(grpc_context, 503, no_replica(request.name))
            return messages().ModelMetadataResponse()

    @guarded(count=True)
    async def ModelInfer(self, request: Any, grpc_context: Any = None) -> Any:
        """Relay a call that named no application to its model, again on another replica if its replica died."""
        started = time.perf_counter()
        handle = self._model(request.model_name, grpc_context)
        if handle is None:
            return messages().ModelInferResponse()
        for attempt in range(REPLICA_RETRIES + 1):
            try:
                status, message, answer = await handle.infer_message.remote(request)
                break
            except (Exception, asyncio.CancelledError) as exc:  # never hand Ray's error text to the client
                if isinstance(exc, asyncio.CancelledError) and not replica_gone(exc):
                    raise  # this call itself was cancelled: its client went away
                if replica_gone(exc) and attempt < REPLICA_RETRIES:  # inference is idempotent: run it elsewhere
                    await asyncio.sleep(retry_delay_s(attempt))
                    continue
                set_status(grpc_context, 503, no_replica(request.model_name))
                self.metrics.observe(request.model_name, 503, time.perf_counter() - started)
                return messages().ModelInferResponse()
        set_status(grpc_context, status, message)
        return answer

    def count_stopped(self, status: int) -> None:
        """A ModelInfer call ``guarded`` stopped (401, 400) counts under the unknown model."""
        self.metrics.observe(UNKNOWN_MODEL, status, 0.0)

    def _model(self, name: str, grpc_context: Any) -> Any:
        """The handle of model ``name``'s application, or None with NOT_FOUND / UNAVAILABLE set."""
        if name not in self.apps:
            set_status(grpc_context, 404, unknown_model(name, self.names))
            return None
        if self.draining:
            set_status(grpc_context, 503, no_replica(name, "the server is draining"))
            return None
        if name not in self._handles:
            from ray import serve

            self._handles[name] = serve.get_app_handle(self.apps[name])
        return self._handles[name]


__all__ = ["SERVER_APP", "SERVER_DEPLOYMENT", "ServerApp"]
