"""Run an OpenAI server until a signal: the core lifecycle (``serve.runner``) with this stack's
application, readiness (each decoder's ``GET /v1/models/NAME`` answers once a replica loaded and
started its engine) and drain (new requests 503, the streams in flight finish).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

from ortpilot.errors import UsageError, VerificationError
from ortpilot.serve.errorbody import OPENAI
from ortpilot.serve.openai.deployment import APP_NAME, deployment_name, openai_deployment
from ortpilot.serve.openai.spec import DecoderSpec
from ortpilot.serve.openai.wire import ROUTE_PREFIX
from ortpilot.serve.options import ServeOptions, ServerOptions
from ortpilot.serve.ready import DecoderReady, Served
from ortpilot.serve.runner import (
    check_cpus,
    check_ports,
    deployment_status,
    failure_reason,
    http_get,
    serve_applications,
    serve_until_stopped,
)


def wait_ready(
    specs: Sequence[DecoderSpec], server: ServerOptions, replicas: int, started: float, failed: list[BaseException]
) -> Served:
    """Each model's ``GET /v1/models/NAME`` once a replica answers it (it loaded and started its engine)."""
    from ray import serve

    url = server.base_url + ROUTE_PREFIX
    headers = server.access.client_headers()
    deadline = time.monotonic() + server.ready_timeout
    ready: dict[str, DecoderReady] = {}
    while len(ready) < len(specs):
        for spec in specs:
            if spec.name not in ready:
                code, doc = http_get(f"{url}/models/{spec.name}", timeout=5.0, headers=headers)
                if code == 200 and doc:
                    ready[spec.name] = DecoderReady(doc, replicas, url, time.perf_counter() - started)
        if failed:
            raise VerificationError(f"The OpenAI application did not deploy: {failed[0]}")
        applications = serve_applications(serve) if len(ready) < len(specs) else {}
        for spec in (s for s in specs if s.name not in ready):  # Ray gave a decoder's deployment up: say why
            status, message = deployment_status(applications, APP_NAME, deployment_name(spec.name))
            if status == "DEPLOY_FAILED":
                raise VerificationError(
                    f"No replica of decoder '{spec.name}' became ready (its deployment failed): "
                    f"{failure_reason(message)}"
                )
        if len(ready) < len(specs) and time.monotonic() > deadline:
            missing = next(s.name for s in specs if s.name not in ready)
            raise VerificationError(
                f"No replica of decoder '{missing}' became ready within {server.ready_timeout:g} s."
            )
        time.sleep(0.2)
    return Served([ready[s.name] for s in specs], url)


def run_openai_server(
    specs: Sequence[DecoderSpec],
    options: ServeOptions,
    server: ServerOptions | None = None,
    *,
    started: float | None = None,
    on_ready: Callable[[Served], None] | None = None,
    stop: threading.Event | None = None,
) -> Served:
    """Start (or join, the options' ``address``) Ray, run ``specs`` at ``/v1`` with the replicas ``options``
    say, serve until SIGINT/SIGTERM.

    The Ray and Serve handling is ``runner``'s (what the Open Inference Protocol application
    uses): exactly what this call started is stopped again.
    """
    server = server or ServerOptions()
    if server.grpc_port is not None:
        raise UsageError(
            "--grpc-port serves the Open Inference Protocol (KServe v2 gRPC); decoders are served over the "
            "OpenAI API only: leave --grpc-port out."
        )
    started = time.perf_counter() if started is None else started
    check_ports(server)
    check_cpus(options, len(specs), server)

    def same_proxy_port() -> None:
        running = _serve_port()
        if running != server.port:
            raise UsageError(
                f"Ray Serve already runs on this cluster with its HTTP proxy on port {running}; "
                f"one cluster has one proxy port, so serve on --port {running} or use another "
                "cluster."
            )

    def build(budget: int) -> list[Any]:
        from ray import serve

        app = openai_deployment(
            specs,
            replicas=options.replicas,
            cpus_per_replica=options.cpus_per_replica,
            cpu_budget=budget,
            settings=server.requests(options),
        )
        # At /: the ingress answers /v1/... and /metrics and the health probes.
        return [serve.RunTarget(app, name=APP_NAME, route_prefix="/")]

    return serve_until_stopped(
        build,
        lambda failed, _stop: wait_ready(specs, server, options.replicas, started, failed),
        server,
        protocol=OPENAI,
        drain=_drain,
        max_request_mb=options.max_request_mb,
        on_ready=on_ready,
        stop=stop,
        joined=same_proxy_port,
    )


DRAIN_WAIT_S = 30.0  # at most this long for the streams in flight to finish after SIGTERM


def _drain() -> None:
    """SIGTERM: the ingress answers 503 + Retry-After from now on; wait for what is in flight to finish."""
    from ray import serve

    ingress = serve.get_app_handle(APP_NAME)
    ingress.drain.remote().result(timeout_s=10)
    deadline = time.monotonic() + DRAIN_WAIT_S
    while time.monotonic() < deadline and ingress.pending.remote().result(timeout_s=10) > 0:
        time.sleep(0.2)


def _serve_port() -> int | None:
    """The HTTP port of the Serve instance running on the cluster (-1 when it cannot be read)."""
    import ray

    try:
        from ray.serve._private.constants import SERVE_CONTROLLER_NAME, SERVE_NAMESPACE

        controller = ray.get_actor(SERVE_CONTROLLER_NAME, namespace=SERVE_NAMESPACE)
        return int(ray.get(controller.get_http_config.remote(), timeout=30).port)
    except Exception:
        return -1


__all__ = ["DRAIN_WAIT_S", "run_openai_server", "wait_ready"]
