"""The OpenAI application on Ray Serve: one deployment per decoder (``DecoderDeployment``: a decoder
replica with Ray's health check and heartbeat) behind one ingress (``ingress.OpenAIIngress``), mounted
at ``/`` (the API under ``/v1``). Ray is imported only inside the functions here.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

from ortpilot.errors import UsageError
from ortpilot.serve import loopback
from ortpilot.serve.counts import HEARTBEAT_S
from ortpilot.serve.defaults import SHUTDOWN_POLL_S, start_tries_option
from ortpilot.serve.fastpath import SERVER_WIDE_ENV
from ortpilot.serve.openai.decoder import DecoderReplica
from ortpilot.serve.openai.ingress import OpenAIIngress
from ortpilot.serve.openai.metrics import EngineCounters, EngineHeartbeat
from ortpilot.serve.openai.spec import DecoderSpec
from ortpilot.serve.options import ServeOptions, ort_threads
from ortpilot.serve.records import RequestSettings
from ortpilot.serve.runner import require_ray

APP_NAME = "ortpilot-openai"
INGRESS_NAME = "openai-ingress"


class DecoderDeployment(DecoderReplica):
    """The decoder deployment's class: a DecoderReplica with Ray's health check."""

    def __init__(self, spec: DecoderSpec, threads: int = 0) -> None:
        from ortpilot.serve.http import replica_logging

        replica_logging()
        loopback.install()  # before Ray binds this replica's gRPC server (after the constructor)
        super().__init__(spec, threads)
        self._ingress = None
        self._replica = f"{os.getpid()}-{id(self)}"

    async def check_health(self) -> None:
        """Ray's health check, every few seconds: the engine must run; also the heartbeat that hands the
        ingress this replica's engine counters for ``/metrics`` (async: a throughput-optimized replica's
        handles work only on its event loop)."""
        if self.scheduler._thread is None or not self.scheduler._thread.is_alive():
            raise RuntimeError("the decode engine thread is not running")
        try:
            if self._ingress is None:
                from ray import serve

                self._ingress = serve.get_deployment_handle(INGRESS_NAME, app_name=APP_NAME)
            counters = EngineCounters.of_engine(self.scheduler.counters())
            self._ingress.report.remote(EngineHeartbeat(self.spec.name, self._replica, counters))
        except Exception:  # the ingress may not be up yet; the next heartbeat tries again
            self._ingress = None


def deployment_name(model: str) -> str:
    """The Serve deployment that runs decoder ``model``'s replicas (in application ``APP_NAME``)."""
    return f"decoder-{model}"


def openai_deployment(
    specs: Sequence[DecoderSpec],
    *,
    replicas: int = 1,
    cpus_per_replica: float | None = None,
    cpu_budget: int | None = None,
    settings: RequestSettings | None = None,
) -> Any:
    """The Ray Serve application for ``specs`` (not yet running): mount it at ``ROUTE_PREFIX``. ``settings``:
    how the ingress takes requests (access policy, body limit, timeout, access log, debug info)."""
    serve = require_ray()
    if replicas < 1:
        raise UsageError(f"--replicas must be at least 1, got {replicas}.")
    if cpu_budget is None:
        from ortpilot.providers.cpubudget import this_budget

        cpu_budget = this_budget().cpus
    cpus = ServeOptions(replicas=replicas, cpus_per_replica=cpus_per_replica).replica_cpus(len(specs), cpu_budget)
    handles = {}
    for spec in specs:
        model = serve.deployment(
            DecoderDeployment,
            name=deployment_name(spec.name),
            num_replicas=replicas,
            ray_actor_options={"num_cpus": cpus},
            # Requests beyond the streams and the queue reach the scheduler, which answers 429 itself.
            max_ongoing_requests=spec.options.max_streams + spec.options.max_queue + 8,
            graceful_shutdown_timeout_s=10.0,
            graceful_shutdown_wait_loop_s=SHUTDOWN_POLL_S,
            health_check_period_s=HEARTBEAT_S,
            **start_tries_option(serve, replicas),
        )
        handles[spec.name] = model.bind(spec, ort_threads(cpus))
    ingress = serve.deployment(
        OpenAIIngress,
        name=INGRESS_NAME,
        num_replicas=1,
        ray_actor_options={"num_cpus": 0, "runtime_env": {"env_vars": SERVER_WIDE_ENV}},
        max_ongoing_requests=4096,
    )
    return ingress.bind(handles, settings or RequestSettings())


__all__ = ["APP_NAME", "INGRESS_NAME", "DecoderDeployment", "deployment_name", "openai_deployment"]
