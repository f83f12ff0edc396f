"""Run a served application until a signal: start or join Ray, deploy, wait for verified replicas.

Readiness is read from the application's own protocol (``/v2/models/NAME/ready`` answers 200 once
a replica verified and reported), so what ``serve`` prints is what a client sees. A replica that
fails verification raises in its constructor; Ray retries it and then marks the deployment
failed, and the error it raised is the reason ``serve`` exits 1 with. Everything this process
started (the application, Serve, a local Ray instance) is shut down on SIGINT/SIGTERM.
"""

from __future__ import annotations

import json
import logging
import os
import re
import signal
import socket
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from ortpilot.errors import UsageError, VerificationError
from ortpilot.serve.options import ModelSpec, ServeOptions, ServerOptions
from ortpilot.serve.ready import ModelReady, Served

log = logging.getLogger("ortpilot")
R = TypeVar("R")  # what an application's readiness wait returns
APP_NAME = "ortpilot"
# Keep a local Ray lean and quiet: no usage stats, every access-log line forwarded as it is.
RAY_ENV = {"RAY_USAGE_STATS_ENABLED": "0", "RAY_DEDUP_LOGS": "0"}
QUIET_LOGS = {"log_level": "WARNING", "enable_access_log": False}  # ortpilot writes its own access log
_ERROR_LINE = re.compile(r"(?:ortpilot\.errors\.)?(\w+Error): (.+)")


def check_port(host: str, port: int) -> None:
    """Exit 2 before anything starts when ``host:port`` is taken."""
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind((host, port))
        except OSError as exc:
            raise UsageError(
                f"Port {port} on {host} is not free ({exc.strerror or exc}). Stop what listens there "
                "or pick another with --port."
            ) from None


def failure_reason(message: str) -> str:
    """The error a replica's constructor raised, from Ray's deployment status message (its traceback)."""
    found = list(_ERROR_LINE.finditer(message))
    if found:
        return f"{found[-1].group(1)}: {found[-1].group(2).strip()}"
    lines = [ln.strip() for ln in message.strip().splitlines() if ln.strip()]
    return lines[-1] if lines else "no replica became ready (Ray gave no reason)"


def _get(url: str, timeout: float = 2.0) -> tuple[int, Any]:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:
            return resp.status, json.loads(resp.read() or b"null")
    except urllib.error.HTTPError as exc:
        return exc.code, None
    except (urllib.error.URLError, OSError, ValueError):
        return 0, None


class Server:
    """What ``run_server`` started, so that ``stop`` shuts down exactly that."""

    def __init__(self, app_name: str = APP_NAME) -> None:
        self.app_name = app_name
        self.started_ray = False
        self.started_serve = False
        self.deployed = False

    def stop(self) -> None:
        from ray import serve

        if self.deployed:
            try:
                serve.delete(self.app_name)  # graceful: replicas finish the requests they hold
            except Exception as exc:
                log.warning("Deleting the application failed: %s", exc)
        if self.started_serve:
            try:
                serve.shutdown()
            except Exception as exc:
                log.warning("Shutting down Serve failed: %s", exc)
        if self.started_ray:
            import ray

            ray.shutdown()


def ray_environment(address: str | None) -> None:
    """Environment for Ray, set before it is imported: lean, and on loopback for a loopback address.

    Ray rewrites a 127.0.0.1 bootstrap address to this machine's network address unless its
    single-machine mode is on; a cluster started on loopback (tests, one machine) needs it.
    """
    for key, value in RAY_ENV.items():
        os.environ.setdefault(key, value)
    host = (address or "").rpartition(":")[0].strip("[]")
    if host in ("127.0.0.1", "localhost", "::1"):
        os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")


def _start_ray(address: str | None, cpus: int) -> tuple[bool, bool]:
    """(started Ray, Serve already running) after connecting to ``address`` or starting a local instance."""
    import ray

    if address:
        ray.init(address=address, log_to_driver=True, logging_level=logging.WARNING)
        started = False
    else:
        # "local": a new instance even where RAY_ADDRESS names another one.
        ray.init(
            address="local",
            num_cpus=cpus,
            include_dashboard=False,
            _node_ip_address="127.0.0.1",
            log_to_driver=True,
            logging_level=logging.WARNING,
        )
        started = True
    try:
        from ray.serve._private.constants import SERVE_CONTROLLER_NAME, SERVE_NAMESPACE

        ray.get_actor(SERVE_CONTROLLER_NAME, namespace=SERVE_NAMESPACE)
        running = True
    except Exception:
        running = False
    return started, running


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
    check_port(server.host, server.port)
    from ortpilot.serve.app import deployment, model_file  # imports no Ray yet

    for spec in specs:
        model_file(spec)  # a profile that cannot load fails here, naming itself, before Ray starts
    return serve_until_stopped(
        APP_NAME,
        "/",
        lambda budget: deployment(list(specs), options=options, cpu_budget=budget),
        lambda deploy_error, stop: Served(
            wait_ready(specs, server, started, stop, deploy_error, options.initial_replicas)
        ),
        server,
        on_ready=on_ready,
        stop=stop,
    )


def serve_until_stopped(
    app_name: str,
    route_prefix: str,
    build: Callable[[int], Any],
    wait: Callable[[list[BaseException], threading.Event], R],
    server_options: ServerOptions,
    *,
    on_ready: Callable[[R], None] | None = None,
    stop: threading.Event | None = None,
    joined: Callable[[], None] | None = None,
) -> R:
    """One served application's life, for every application ``serve`` runs: start (or join, the options'
    ``address``) Ray and Serve, deploy ``build(cpu_budget)`` as ``app_name`` at ``route_prefix`` in the background,
    ``wait(deploy_errors, stop)`` for its ready replicas, hand them to ``on_ready``, then serve until
    SIGINT/SIGTERM or ``stop``; exactly what this call started is stopped again. ``joined`` runs when
    Serve already runs on the cluster (the caller's check that it can share that Serve)."""
    ray_environment(server_options.address)
    from ortpilot.serve.app import require_ray

    serve = require_ray()
    from ortpilot.providers.cpubudget import this_budget

    budget = this_budget().cpus
    server = Server(app_name)
    stop = stop or threading.Event()
    previous: dict[int, Any] = {}
    try:
        server.started_ray, serve_running = _start_ray(server_options.address, budget)
        if threading.current_thread() is threading.main_thread():
            # After ray.init, which installs its own handlers (they print a stack dump and exit at once).
            previous = {sig: signal.signal(sig, lambda *_: stop.set()) for sig in (signal.SIGINT, signal.SIGTERM)}
        logging.getLogger("ray.serve").setLevel(logging.WARNING)
        if serve_running:
            if joined is not None:
                joined()
        else:
            serve.start(
                http_options={"host": server_options.host, "port": server_options.port}, logging_config=QUIET_LOGS
            )
            server.started_serve = True  # the next server on a shared cluster starts Serve on its own port
        app = build(budget)
        deploy_error: list[BaseException] = []

        def deploy() -> None:
            try:
                serve.run(app, name=app_name, route_prefix=route_prefix, logging_config=QUIET_LOGS)
            except BaseException as exc:  # ``wait`` reports it, with the replica's reason where there is one
                deploy_error.append(exc)

        server.deployed = True
        threading.Thread(target=deploy, name="ortpilot-deploy", daemon=True).start()
        ready = wait(deploy_error, stop)
        if on_ready:
            on_ready(ready)
        while not stop.wait(0.5):
            pass
        return ready
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        server.stop()


def wait_ready(
    specs: Sequence[ModelSpec],
    server: ServerOptions,
    started: float,
    stop: threading.Event,
    deploy_error: list[BaseException],
    expected: int = 1,
) -> list[ModelReady]:
    """Poll each model until ``expected`` replicas verified; at the deadline one is enough (the line says
    how many), none is exit 1 with the reason Ray recorded for the replica."""
    from ray import serve

    timeout = server.ready_timeout
    base = server.base_url
    ready: dict[str, ModelReady] = {}
    deadline = time.monotonic() + timeout
    reasons: dict[str, str] = {}
    while len(ready) < len(specs):
        if stop.is_set():
            raise KeyboardInterrupt
        late = time.monotonic() > deadline
        for spec in specs:
            if spec.name in ready:
                continue
            code, _ = _get(f"{base}/v2/models/{spec.name}/ready")
            if code == 200:
                _, meta = _get(f"{base}/v2/models/{spec.name}")
                replicas = ((meta or {}).get("ortpilot") or {}).get("replicas") or []
                if len(replicas) < expected and not late:
                    continue
                providers = list(dict.fromkeys(p for r in replicas for p in r.get("providers", [])[:1]))
                notes = sorted({r["threads_note"] for r in replicas if r.get("threads_note")})
                if len(replicas) < expected:
                    notes.insert(0, f"{len(replicas)} of {expected} replicas verified within {timeout:g} s")
                if any(r.get("verification") == "not checked" for r in replicas):
                    notes.append(
                        "outputs not checked: "
                        + next(r["why"] for r in replicas if r.get("verification") == "not checked")
                    )
                ready[spec.name] = ModelReady(
                    spec.name,
                    len(replicas),
                    providers,
                    f"{base}/v2/models/{spec.name}",
                    time.perf_counter() - started,
                    notes,
                    replicas,
                )
        if len(ready) == len(specs):
            break
        failed = _failed(serve, specs, ready, reasons)
        if failed or late:
            name = failed or next(s.name for s in specs if s.name not in ready)
            reason = reasons.get(name) or (deploy_error and str(deploy_error[0])) or "its replicas did not start"
            raise VerificationError(
                f"No replica of model '{name}' became ready "
                f"{'(its deployment failed)' if failed else f'within {timeout:g} s'}: "
                f"{failure_reason(str(reason))}"
            )
        time.sleep(0.5)
    return [ready[s.name] for s in specs]


def _failed(
    serve: Any, specs: Sequence[ModelSpec], ready: dict[str, ModelReady], reasons: dict[str, str]
) -> str | None:
    """The first model whose deployment Ray gave up on; keeps each model's latest status message."""
    try:
        status = serve.status().applications.get(APP_NAME)
    except Exception:
        return None
    if status is None:
        return None
    for spec in specs:
        dep = status.deployments.get(f"model-{spec.name}")
        if dep is None or spec.name in ready:
            continue
        if dep.message:
            reasons[spec.name] = dep.message
        if str(getattr(dep.status, "value", dep.status)) == "DEPLOY_FAILED":
            return spec.name
    return None


__all__ = ["APP_NAME", "check_port", "failure_reason", "run_server", "serve_until_stopped", "wait_ready"]
