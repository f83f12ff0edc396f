"""Readiness of an Open Inference Protocol server: ``run_server`` serves its models through the core
lifecycle (``serve.runner``) and waits until each answers ready the way a client sees it.

Readiness is read from the server's own protocol (``/v2/models/NAME/ready`` answers 200 once a
replica verified, and with ``--grpc-port`` ``ModelReady`` over gRPC both ways a client calls it),
so what ``serve`` prints is what a client sees. A replica that fails verification raises in its
constructor; Ray retries it and then marks the deployment failed, and the error it raised is the
reason ``serve`` exits 1 with.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

from ortpilot.errors import VerificationError
from ortpilot.serve.errorbody import OIP
from ortpilot.serve.oip.grpc_service import PROXY_CALLBACK, SERVICER, model_ready
from ortpilot.serve.oip.replicainfo import ReplicaInfo
from ortpilot.serve.oip.server import SERVER_APP
from ortpilot.serve.options import ModelSpec, ServeOptions, ServerOptions
from ortpilot.serve.ready import ModelReady, Served
from ortpilot.serve.runner import (
    GrpcEntry,
    check_cpus,
    check_ports,
    deployment_status,
    failure_reason,
    http_get,
    serve_applications,
    serve_until_stopped,
)

log = logging.getLogger(__name__)


def run_server(
    specs: Sequence[ModelSpec],
    options: ServeOptions,
    server: ServerOptions | None = None,
    *,
    started: float | None = None,
    on_ready: Callable[[Served], None] | None = None,
    stop: threading.Event | None = None,
) -> Served:
    """Serve ``specs`` until SIGINT/SIGTERM (or ``stop`` is set); returns the ready models.

    Raises UsageError (exit 2) for a taken port or a bad profile before Ray starts, and
    VerificationError (exit 1) naming the model when no replica verified within the ready timeout.
    """
    server = server or ServerOptions()
    started = time.perf_counter() if started is None else started
    check_ports(server)
    check_cpus(options, len(specs), server)
    from ortpilot.serve.oip.app import applications, model_file  # imports no Ray yet
    from ortpilot.serve.textfacts import text_facts

    text_models = []
    for spec in specs:
        model_file(spec)  # a profile that cannot load fails here, naming itself, before Ray starts
        if text_facts(spec).text:  # and so does a text model whose tokenizer changed since its tune
            text_models.append(spec.name)
    return serve_until_stopped(
        lambda budget: applications(list(specs), options=options, server=server, cpu_budget=budget),
        lambda deploy_error, stop: Served(
            wait_ready(specs, server, started, stop, deploy_error, options.initial_replicas)
        ),
        server,
        grpc=GrpcEntry(SERVICER, PROXY_CALLBACK, specs[0].name if len(specs) == 1 else SERVER_APP),
        protocol=OIP,
        drain=_drain_server,
        max_request_mb=options.max_request_mb,
        on_ready=on_ready,
        stop=stop,
        text_models=text_models,
    )


def _drain_server() -> None:
    from ray import serve

    serve.get_app_handle(SERVER_APP).drain.remote().result(timeout_s=10)


def wait_ready(
    specs: Sequence[ModelSpec],
    server: ServerOptions,
    started: float,
    stop: threading.Event,
    deploy_error: list[BaseException],
    expected: int = 1,
) -> list[ModelReady]:
    """Poll each model until ``expected`` replicas verified; at the deadline one is enough (the line says
    how many), none is exit 1 with the reason Ray recorded for the replica, or else with what the model
    was still missing (an HTTP answer, a gRPC route, its replicas' reports)."""
    from ray import serve

    timeout = server.ready_timeout
    headers = server.access.client_headers()
    ready: dict[str, ModelReady] = {}
    waiting: dict[str, str] = {}  # model -> what it still lacked at the last poll
    deadline = time.monotonic() + timeout
    reasons: dict[str, str] = {}
    routes = _RouteReload()
    while len(ready) < len(specs):
        if stop.is_set():
            raise KeyboardInterrupt
        late = time.monotonic() > deadline
        for spec in specs:
            if spec.name not in ready:
                found = _probe(serve, spec.name, server, headers, expected, late, started)
                if isinstance(found, ModelReady):
                    found.notes.extend(_text_note(spec))
                    ready[spec.name] = found
                else:
                    waiting[spec.name] = found
        if len(ready) == len(specs):
            break
        routes.check(any(GRPC_MISSING in waiting[name] for name in waiting if name not in ready))
        failed = _failed(serve, specs, ready, reasons)
        if failed or late:
            name = failed or next(s.name for s in specs if s.name not in ready)
            reason = reasons.get(name) or (deploy_error and str(deploy_error[0])) or ""
            raise VerificationError(
                f"No replica of model '{name}' became ready "
                f"{'(its deployment failed)' if failed else f'within {timeout:g} s'}: "
                + (failure_reason(str(reason)) if reason else waiting.get(name, "its replicas did not start"))
            )
        time.sleep(0.5)
    return [ready[s.name] for s in specs]


GRPC_MISSING = "it answers ready over HTTP but not over gRPC"
ROUTE_RELOAD_AFTER_S = 15.0  # HTTP up this long with a gRPC route missing: HAProxy missed its reload


class _RouteReload:
    """Asks HAProxy's manager to reload its routes when some model has answered over HTTP but not over gRPC
    for ``ROUTE_RELOAD_AFTER_S`` (``proxyroutes``), and again after each further interval."""

    def __init__(self) -> None:
        self.since: float | None = None

    def check(self, missing: bool) -> None:
        now = time.monotonic()
        if not missing:
            self.since = None
        elif self.since is None:
            self.since = now
        elif now - self.since >= ROUTE_RELOAD_AFTER_S:
            from ortpilot.serve.proxyroutes import reload_routes

            if reload_routes():
                log.warning("HAProxy had no gRPC route for a model that answers over HTTP; its routes were reloaded.")
            self.since = now


def _text_note(spec: ModelSpec) -> list[str]:
    """What a text model's ready line adds: the endpoint its text goes to."""
    from ortpilot.serve.textfacts import text_facts
    from ortpilot.serve.textwire import use_of

    facts = text_facts(spec)
    if not facts.text:
        return []
    inputs = "inputs 'query' and 'text'" if facts.kind == "rerank" else "input 'text'"
    return [f"text: {use_of(facts.kind)} or KServe v2 BYTES {inputs}"]


def _probe(
    serve: Any, name: str, server: ServerOptions, headers: dict[str, str], expected: int, late: bool, started: float
) -> ModelReady | str:
    """Model ``name``'s ready line, or what it still lacks: ready over HTTP, then over gRPC both ways, then
    ``expected`` replicas reported to the server-wide application (at the deadline one is enough)."""
    base = server.base_url
    code, _ = http_get(f"{base}/v2/models/{name}/ready", headers=headers)
    if code != 200:
        return f"GET /v2/models/{name}/ready answered {code or 'nothing'}; its replicas did not start"
    missing = _grpc_missing(server, name, headers)
    if missing:
        return f"{GRPC_MISSING} {missing}"
    replicas = _replica_infos(serve, name)
    if len(replicas) < expected and not late:
        return f"{len(replicas)} of {expected} replicas reported to the server-wide application"
    providers = list(dict.fromkeys(p for r in replicas for p in r.providers[:1]))
    notes = sorted({r.threads_note for r in replicas if r.threads_note})
    if len(replicas) < expected:
        notes.insert(0, f"{len(replicas)} of {expected} replicas verified within {server.ready_timeout:g} s")
    unchecked = [r.why for r in replicas if r.verification == "not checked"]
    if unchecked:
        notes.append("outputs not checked: " + unchecked[0])
    return ModelReady(
        name,
        len(replicas),
        providers,
        f"{base}/v2/models/{name}",
        time.perf_counter() - started,
        notes,
        [r.to_dict() for r in replicas],
    )


def _grpc_missing(server: ServerOptions, name: str, headers: dict[str, str]) -> str:
    """With ``--grpc-port``: which way of calling model ``name`` over gRPC does not answer ready yet ("" when
    all do, or without gRPC): with ``application: NAME`` (straight to its replicas), without (the one model,
    or relayed by the server-wide app) and with ``application: ortpilot`` (the server-wide app, which a
    one-model server also runs: CI once called it right after ready and got NOT_FOUND). HAProxy learns gRPC
    routes on a reload of its own, after the REST ones, one application at a time."""
    if server.grpc_port is None:
        return ""
    address = server.netloc(server.grpc_port)
    ways = (
        ({"application": name}, f"at {address} with 'application: {name}' (HAProxy's route to its replicas)"),
        ({}, f"at {address} without 'application' (relayed by the server-wide application)"),
        ({"application": SERVER_APP}, f"at {address} with 'application: {SERVER_APP}' (the server-wide application)"),
    )
    for extra, way in ways:
        if not model_ready(address, name, {**headers, **extra}):
            return way
    return ""


def _replica_infos(serve: Any, name: str) -> list[ReplicaInfo]:
    """The verified replicas of model ``name`` as the server-wide application knows them (they report there)."""
    try:
        return list(serve.get_app_handle(SERVER_APP).replica_infos.remote(name).result(timeout_s=10))
    except Exception:
        return []


def _failed(
    serve: Any, specs: Sequence[ModelSpec], ready: dict[str, ModelReady], reasons: dict[str, str]
) -> str | None:
    """The first model whose deployment Ray gave up on; keeps each model's latest status message."""
    applications = serve_applications(serve)
    for spec in specs:
        if spec.name in ready:
            continue
        status, message = deployment_status(applications, spec.name, f"model-{spec.name}")
        if message:
            reasons[spec.name] = message
        if status == "DEPLOY_FAILED":
            return spec.name
    return None


__all__ = ["run_server", "wait_ready"]
