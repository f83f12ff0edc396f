"""One model replica: a verified session that answers its model's requests itself, REST and gRPC.

The constructor is the gate: it loads the profile strictly with intra-op threads set to the
replica's CPUs (Ray sets ``OMP_NUM_THREADS``, which ORT ignores), reproduces the reference
outputs (``tune.verify.verify_profile``) and raises when they differ, so Ray never routes a
request to a replica that did not verify; a restarted replica goes through the same gate.

A replica is its model's own Serve application (route prefix ``/v2/models/NAME``): HAProxy, or
Ray's proxy, hands it the request directly (``__call__`` for REST, the KServe v2 method for
gRPC), one hop. Runs go to one worker thread (the event loop stays free to read the next
request and collect the next batch); models with a batch dim stack requests of the same
non-batch shapes (``batcher``: the requests that wait while a run is busy share the next one). What only a replica knows (its counts, what it verified)
it reports to the server-wide application, which sums every replica for ``/metrics``.
"""

from __future__ import annotations

import asyncio
import os
import socket
import time
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np

from ortpilot.errors import InputError, OrtpilotError, OrtRunError
from ortpilot.serve.counts import REPORT_S, RequestCounts
from ortpilot.serve.http import (
    BodyError,
    Reply,
    dispatch,
    error_reply,
    internal_error,
    printable,
    read_body,
    replica_logging,
)
from ortpilot.serve.oip.batcher import Batcher
from ortpilot.serve.oip.config import ReplicaConfig
from ortpilot.serve.oip.grpc_codec import decode_infer, encode_infer, messages, model_metadata, server_metadata
from ortpilot.serve.oip.grpc_rpcs import UnservedRpcs, guarded, set_status
from ortpilot.serve.oip.metrics import BatchCounts
from ortpilot.serve.oip.routes import OipErrors
from ortpilot.serve.options import ModelSpec, ort_threads
from ortpilot.serve.ortmessage import clean_ort_message
from ortpilot.serve.pipeline import Pipeline
from ortpilot.session.binding import run_session


def load_verified(spec: ModelSpec, threads: int, accept_machine: bool = False) -> tuple[Any, dict[str, Any]]:
    """(session, verification facts) for ``spec``; raises the verification's own error when it fails.

    A bundle's replica verifies the profile of its own node's class (the node's Ray CPUs in the class:
    ``fleet.nodes``), refused without one unless ``accept_machine``; ``why`` names the class it took."""
    if spec.kind == "profile":
        from ortpilot.tuning.verify import verify_profile

        target, node_cpus = spec.path, None
        if spec.bundle:
            from ortpilot.fleet.nodes import this_node_cpus

            target, node_cpus = spec.bundle, this_node_cpus()
        result = verify_profile(
            target, accept_machine=accept_machine, intra_op_threads=threads, optimized=True, node_cpus=node_cpus
        )
        failure = result.failure()
        if failure is not None:
            raise failure
        profile_threads = int((result.session.profile.get("session_settings") or {}).get("intra_op_threads") or 0)
        choice = result.bundle
        chosen = (
            f"class {choice.chosen.name} ({choice.note or choice.how}) of bundle {choice.bundle.parent.name}: "
            if choice
            else ""
        )
        return result.session, {
            "mode": result.mode,
            "why": chosen + result.why,
            "profile_threads": profile_threads,
            "optimized_model": result.session.settings.level == "disable"
            and bool(result.session.profile.get("optimized_model")),
        }
    from ortpilot.session import SessionSettings, load

    session = load(spec.path, ["cpu"], "strict", settings=SessionSettings(intra_op_threads=threads))
    return session, {
        "mode": "not checked",
        "profile_threads": 0,
        "optimized_model": False,
        "why": "a plain model has no reference outputs: the strict CPU session was verified",
    }


def thread_note(threads: int, profile_threads: int) -> str:
    """What a replica says when its threads differ from the profile's (its latency may then differ)."""
    if not profile_threads or threads == profile_threads:
        return ""
    return (
        f"intra-op threads {threads} (the replica's CPUs), the profile was tuned with {profile_threads}: "
        "its latency figures may not hold"
    )


# What a client may see of a replica without --debug-info: no paths, PIDs, hosts or node ids.
PUBLIC_INFO = (
    "replica",
    "model",
    "verified",
    "verification",
    "why",
    "providers",
    "placement_share",
    "intra_op_threads",
    "cpus",
    "profile_intra_op_threads",
    "threads_note",
    "batching",
    "load_s",
    "session_create_s",
    "optimized_model",
)


class ModelReplica(UnservedRpcs):
    """The model deployment's class (Ray Serve wraps it; nothing here needs Ray but the batcher)."""

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
        self.output_names = [o.name for o in self.session.get_outputs()]
        self.batching = config.batching
        self.counts = BatchCounts()
        self.requests = RequestCounts()
        self.executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="ortpilot-run")
        self.iobinding = bool((getattr(self.session, "profile", None) or {}).get("iobinding"))
        self.replica_id = _replica_id()
        self.settings = config.requests
        self.debug_info = config.requests.debug_info
        self.pipeline = Pipeline(config.requests, OipErrors(), self._observe, refused_model=spec.name)
        self.guard = self.pipeline.guard
        self.limits = config.limits
        self.info = self._info(verification, started)
        self._server = None
        self._server_app = config.server_app
        self._reported = 0.0
        self.routes = model_routes(self)
        if self.batching:
            self.batcher = Batcher(self._run_group, self.executor, config.max_batch, config.batch_wait_ms / 1000.0)

    def _info(self, verification: Mapping[str, Any], started: float) -> dict[str, Any]:
        """What this replica verified and runs with (``describe``; clients see ``PUBLIC_INFO`` of it)."""
        placement = self.session.placement
        return {
            "replica": self.replica_id,
            "model": self.spec.name,
            "verified": True,
            "verification": verification["mode"],
            "why": verification["why"],
            "providers": self.session.providers,
            "placement_share": ({p: round(placement.share(p), 6) for p in placement.counts} if placement else {}),
            "intra_op_threads": self.threads,
            "cpus": self.cpus,
            "profile_intra_op_threads": verification["profile_threads"],
            "threads_note": thread_note(self.threads, verification["profile_threads"]),
            "batching": (
                {"max_batch": self.config.max_batch, "wait_ms": self.config.batch_wait_ms} if self.batching else None
            ),
            "node": _node_id(),
            "host": socket.gethostname(),
            "pid": os.getpid(),
            "load_s": round(time.perf_counter() - started, 3),
            "session_create_s": round(getattr(self.session, "create_s", 0.0), 4),
            "optimized_model": verification["optimized_model"],
        }

    # -- REST ---------------------------------------------------------------------------------------
    async def __call__(self, request: Any) -> Any:
        """One HTTP request for this model (the full path: ``/v2/models/NAME/...``), through the pipeline."""
        return await self.pipeline.handle(request, lambda: dispatch(self.routes, request))

    def _observe(self, request: Any, reply: Reply, seconds: float) -> None:
        """The pipeline's count: every answer in this replica's requests, reported now and then."""
        self.requests.observe(reply.status, seconds)
        self._maybe_report()

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
        return {
            "name": self.name,
            "versions": ["1"],
            "platform": "onnxruntime_onnx",
            "inputs": [t.to_dict() for t in self.config.inputs],
            "outputs": [t.to_dict() for t in self.config.outputs],
            "ortpilot": {**self.config.facts, "ready": True, "replicas": replicas},
        }

    async def replica_infos(self) -> list[dict[str, Any]]:
        """Every live replica's info as the server-wide application holds it (this one's when it cannot)."""
        infos = None
        server = self._server_handle()
        if server is not None:
            try:
                infos = await server.replica_infos.remote(self.name)
            except Exception:
                infos = None
        infos = infos or [self.info]
        return [i if self.debug_info else {k: i[k] for k in PUBLIC_INFO if k in i} for i in infos]

    # -- gRPC (KServe v2): every RPC behind ``guarded`` (key check, message check) ----------------------
    @guarded(health=True)
    async def ServerLive(self, request: Any, grpc_context: Any = None) -> Any:  # RPC methods carry KServe v2 names
        return messages().ServerLiveResponse(live=True)

    @guarded(health=True)
    async def ServerReady(self, request: Any, grpc_context: Any = None) -> Any:
        return messages().ServerReadyResponse(ready=True)

    @guarded()
    async def ServerMetadata(self, request: Any, grpc_context: Any = None) -> Any:
        """The server's metadata: a call without ``application`` metadata comes here when one model is served."""
        return server_metadata()

    @guarded()
    async def ModelReady(self, request: Any, grpc_context: Any = None) -> Any:
        return messages().ModelReadyResponse(ready=request.name == self.name and request.version in ("", "1"))

    @guarded()
    async def ModelMetadata(self, request: Any, grpc_context: Any = None) -> Any:
        if request.name != self.name or request.version not in ("", "1"):
            set_status(grpc_context, 404, _unknown(request.name, request.version))
            return messages().ModelMetadataResponse()
        return model_metadata(self.name, self.config.inputs, self.config.outputs)

    @guarded(count=True)
    async def ModelInfer(self, request: Any, grpc_context: Any = None) -> Any:
        """KServe v2 ModelInfer: the same checks and outputs as REST infer; errors as gRPC status codes."""
        status, message, answer = await self.infer_message(request)
        set_status(grpc_context, status, message)
        return answer

    def count_stopped(self, status: int) -> None:
        """A ModelInfer call ``guarded`` stopped (401, 400) counts in this model's requests."""
        self.requests.observe(status, 0.0)

    async def infer_message(self, request: Any) -> tuple[int, str, Any]:
        """(HTTP-like status, error message, ModelInferResponse) of a ModelInferRequest: what ModelInfer
        answers here, and what the server-wide application relays for clients that name no application."""
        started = time.perf_counter()
        status, message, answer = 200, "", None
        if request.model_name != self.name or request.model_version not in ("", "1"):
            status, message = 404, _unknown(request.model_name, request.model_version)
        else:
            try:
                feeds, outputs = decode_infer(request, self.settings.max_request_bytes)
                result = await self.infer(feeds, outputs)
            except InputError as exc:
                result = {"error": str(exc), "code": 400}
            except Exception as exc:  # the client gets a request id, the log the traceback
                result = {"error": internal_error(f"gRPC ModelInfer {self.name}", exc), "code": 500}
            if "error" in result:
                status, message = int(result.get("code", 500)), result["error"]
            else:
                answer = encode_infer(self.name, result["outputs"], request.id)
        self.requests.observe(status, time.perf_counter() - started)
        self._maybe_report()
        return status, message, answer if answer is not None else messages().ModelInferResponse()

    # -- requests -----------------------------------------------------------------------------------
    async def infer(self, feeds: Mapping[str, np.ndarray], outputs: Sequence[str] | None = None) -> dict[str, Any]:
        """Check the feeds as the library does (400 on failure), run them, return the outputs or an error."""
        try:
            checked = self.session.check_feeds(feeds)
            self.limits.check(checked)  # positions and table rows the graph tells: 400 before ORT runs
            wanted = self._wanted(outputs)
            if self.batching:
                values = await self.batcher.submit(checked)
            else:
                values = await asyncio.get_running_loop().run_in_executor(self.executor, self._run_one, checked)
        except (InputError, OrtRunError) as exc:  # OrtRunError: valid dtypes and ranks the model cannot run
            return {"error": clean_ort_message(str(exc)), "code": 400}
        except OrtpilotError as exc:
            return {"error": internal_error(f"infer {self.name}", exc), "code": 500}
        return {"outputs": {n: values[n] for n in wanted}}

    def describe(self) -> dict[str, Any]:
        return dict(self.info)

    async def check_health(self) -> None:
        """Ray's health check, every few seconds: also the heartbeat that tells the server-wide application
        this replica is alive and verified (it only exists once the constructor's verification passed).
        Async: a throughput-optimized replica's handles work only on its event loop."""
        self._report()

    # -- running ------------------------------------------------------------------------------------
    def _wanted(self, outputs: Sequence[str] | None) -> list[str]:
        if outputs is None:
            return list(self.output_names)
        unknown = [n for n in outputs if n not in self.output_names]
        if unknown:
            raise InputError(
                f"Unknown output name(s) {', '.join(map(repr, unknown))}. The model's outputs are: "
                f"{', '.join(self.output_names)}."
            )
        return list(outputs)

    def _run_one(self, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        self.counts.observe(1)
        return self._run(feeds)

    def _run(self, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """The path the profile was timed and verified on (IOBinding or not): ``session.binding``."""
        return run_session(self.session, feeds, iobinding=self.iobinding, output_names=self.output_names)

    def _run_group(self, group: list[dict[str, np.ndarray]]) -> list[Any]:
        if len(group) > 1:
            rows = [next(iter(feeds.values())).shape[0] for feeds in group]
            stacked = {name: np.concatenate([feeds[name] for feeds in group]) for name in group[0]}
            try:
                self.counts.observe(len(group))
                merged = self._run(stacked)
                total = sum(rows)
                if all(v.ndim and v.shape[0] == total for v in merged.values()):
                    cuts = np.cumsum(rows)[:-1]
                    parts = {name: np.split(value, cuts) for name, value in merged.items()}
                    return [{name: parts[name][i] for name in merged} for i in range(len(group))]
            except OrtpilotError:
                pass  # one bad request must not fail its batch: run them one by one below
        out: list[Any] = []
        for feeds in group:
            try:
                out.append(self._run_one(feeds))
            except OrtpilotError as exc:  # this request's failure is this request's alone
                out.append(exc)
        return out

    # -- reporting ----------------------------------------------------------------------------------
    def _server_handle(self) -> Any:
        if not self._server_app:
            return None
        if self._server is None:
            try:
                from ray import serve

                from ortpilot.serve.oip.server import SERVER_DEPLOYMENT

                self._server = serve.get_deployment_handle(SERVER_DEPLOYMENT, app_name=self._server_app)
            except Exception:  # the server-wide application may not be up yet; the next report tries again
                return None
        return self._server

    def _report(self) -> None:
        server = self._server_handle()
        if server is None:
            return
        self._reported = time.monotonic()
        try:
            server.report.remote(
                self.name, self.replica_id, self.info, self.counts.snapshot(), self.requests.snapshot()
            )
        except Exception:
            self._server = None

    def _maybe_report(self) -> None:
        if time.monotonic() - self._reported >= REPORT_S:
            self._report()


def _unknown(name: str, version: str) -> str:
    return f"Unknown model {printable(name, 80)!r} version {printable(version, 40)!r} here."


def _replica_id() -> str:
    try:
        from ray import serve

        return serve.get_replica_context().replica_id.unique_id
    except Exception:
        return f"pid-{os.getpid()}"


def _node_id() -> str:
    try:
        import ray

        return ray.get_runtime_context().get_node_id()
    except Exception:
        return ""


__all__ = ["ModelReplica", "load_verified", "thread_note"]
