"""One server's life, whichever stack it runs: start or join Ray, start Serve on the ingress path the
options ask for, deploy the stack's applications, wait for the stack's readiness, serve until a
signal, drain, stop.

Each stack brings what is its own (``oip.readiness``, ``openai.server``): its applications, how it
knows it is ready, how it drains, and for the OIP stack what ``--grpc-port`` serves (``GrpcEntry``).
On SIGINT/SIGTERM the stack's drain runs (new requests get 503 with Retry-After), each model's
application is deleted (its replicas finish what they hold), then everything this process started
(the applications, Serve, a local Ray instance, the run folder) is stopped. Nothing here names a
stack: the core imports neither.
"""

from __future__ import annotations

import errno
import json
import logging
import os
import re
import shutil
import signal
import socket
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn, TypeVar

from ortpilot import rayenv
from ortpilot.errors import UsageError, VerificationError
from ortpilot.serve import fastpath, processes
from ortpilot.serve.defaults import DEFAULT_MAX_REQUEST_MB, megabytes
from ortpilot.serve.errorbody import OIP
from ortpilot.serve.options import ServeOptions, ServerOptions

log = logging.getLogger("ortpilot")
R = TypeVar("R")  # what an application's readiness wait returns
QUIET_LOGS = {"log_level": "WARNING", "enable_access_log": False}  # ortpilot writes its own access log
INSTALL_HINT = "pip install 'ortpilot[serve]' (Ray Serve, prometheus_client, tritonclient's gRPC messages)"
_ERROR_LINE = re.compile(r"(?:ortpilot\.errors\.)?(\w+Error): (.+)")


def check_port(host: str, port: int, flag: str = "--port") -> None:
    """Exit 2 before anything starts when ``host:port`` is taken. The test bind uses ``SO_REUSEADDR``, as
    the listeners that will bind it do (HAProxy, Ray's proxy): a port that holds only TIME-WAIT sockets
    (a server stopped moments ago) is free for them, one with a live listener is not."""
    try:  # the family of what the host names (a name may have IPv6 addresses only)
        family = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0][0]
    except socket.gaierror as exc:
        _not_a_host(host, exc.strerror or str(exc))
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError as exc:
            why = exc.strerror or str(exc)
            if isinstance(exc, socket.gaierror) or exc.errno in (errno.EADDRNOTAVAIL, errno.EINVAL):
                _not_a_host(host, why)
            if exc.errno == errno.EACCES:
                raise UsageError(
                    f"Port {port} on {host} needs privileges this process lacks ({why}): ports below 1024 are "
                    f"reserved. Pick another with {flag}, or put a proxy with the privilege in front."
                ) from None
            raise UsageError(
                f"Port {port} on {host} is not free ({why}). Stop what listens there or pick another with {flag}."
            ) from None


def _not_a_host(host: str, why: str) -> NoReturn:
    hint = f" Write an IPv6 address without brackets (--host {host.strip('[]')})." if host.startswith("[") else ""
    raise UsageError(
        f"--host {host} is not an address this machine can listen on ({why}).{hint} Give one of its own "
        "addresses: 127.0.0.1 (this machine only), 0.0.0.0 (every interface) or an interface's address."
    ) from None


def serve_applications(serve: Any) -> Mapping[str, Any]:
    """Serve's application statuses by name (one ``serve.status()`` call: ask once per poll); {} when Serve cannot
    be asked."""
    try:
        return serve.status().applications
    except Exception:
        return {}


def deployment_status(applications: Mapping[str, Any], app: str, deployment: str) -> tuple[str, str]:
    """(status, message) Ray Serve records for ``deployment`` of application ``app`` in ``applications``
    (``serve_applications``): ``DEPLOY_FAILED`` once Ray gave it up, the message holding the traceback its replica's
    constructor raised; ("", "") while Serve does not list it."""
    status = applications.get(app)
    dep = status.deployments.get(deployment) if status is not None else None
    if dep is None:
        return "", ""
    return str(getattr(dep.status, "value", dep.status)), dep.message or ""


def failure_reason(message: str) -> str:
    """The error a replica's constructor raised, from Ray's deployment status message (its traceback)."""
    found = list(_ERROR_LINE.finditer(message))
    if found:
        return f"{found[-1].group(1)}: {found[-1].group(2).strip()}"
    lines = [ln.strip() for ln in message.strip().splitlines() if ln.strip()]
    return lines[-1] if lines else "no replica became ready (Ray gave no reason)"


def http_get(url: str, timeout: float = 2.0, headers: dict[str, str] | None = None) -> tuple[int, Any]:
    """(status, JSON body) of a GET the driver makes itself (readiness), with its key when it has one."""
    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers=headers or {}), timeout=timeout) as resp:
            return resp.status, json.loads(resp.read() or b"null")
    except urllib.error.HTTPError as exc:
        return exc.code, None
    except (urllib.error.URLError, OSError, ValueError):
        return 0, None


class Server:
    """What ``serve_until_stopped`` started, so that ``stop`` drains and shuts down exactly that."""

    def __init__(self) -> None:
        self.started_ray = False
        self.started_serve = False
        self.apps: list[str] = []  # the applications this server deployed, the server-wide one last
        self.drain: Callable[[], None] | None = None
        self.run_dir: Path | None = None
        self.ray_processes: dict[int, int] = {}  # pid -> start time of each process ray.init started (its children)
        self.hurry = threading.Event()  # a second signal: stop without waiting for the drain
        self._ending_ray = False  # set when this server's own ray.shutdown begins: its processes end then
        self.abandoned = False  # set when the graceful stop is left behind: it makes no further Ray call

    def stop(self) -> None:
        """Drain and stop what this server started. When the Ray instance it started stopped first (a signal to
        the whole process group), nothing can be drained, and on a second signal the user wants no wait: the
        graceful stop is left behind and what remains (Ray's processes, HAProxy) is ended at once."""
        try:
            log.info("Stopping: draining what this server runs (a second SIGINT/SIGTERM stops without waiting).")
            # The graceful stop talks to Ray, which waits 60 s for a head that is gone: it runs beside a watch.
            graceful = threading.Thread(target=self._stop_gracefully, name="ortpilot-stop", daemon=True)
            graceful.start()
            while graceful.is_alive():
                graceful.join(0.2)
                why = self._why_leave() if graceful.is_alive() else None
                if why:
                    log.warning(why)
                    self.abandoned = True
                    if self.started_ray:  # this server's own instance: its processes would outlive the wait
                        processes.end(self.ray_processes, wait_s=2.0)
                    break
        finally:
            if self.run_dir is not None:  # HAProxy, whose config is in the run folder
                left = processes.ending_processes_using(self.run_dir, names=("haproxy",))
                if left:
                    log.info("Ended %d HAProxy process(es) left running from this server's run folder.", len(left))
                shutil.rmtree(self.run_dir, ignore_errors=True)

    def _why_leave(self) -> str | None:
        """Why the graceful stop is to be left behind now (a warning), or None to wait on."""
        if self.hurry.is_set():
            return "A second signal: stopping now, without waiting for the models to drain."
        gone = [pid for pid, started in self.ray_processes.items() if not processes.same(pid, started)]
        if self.started_ray and not self._ending_ray and gone:
            return (
                "Ray's own processes stopped before this server did (a signal to the whole process group reaches "
                "them too): nothing left to drain; ending what remains of the server. Send the signal to the "
                "serve process alone to drain first."
            )
        return None

    def _stop_gracefully(self) -> None:
        try:
            self._drain_and_shut_down()
        except Exception as exc:  # a failure of Ray's own calls: said in one line, the stop goes on
            if not self.abandoned:
                log.warning("Stopping the server did not finish: %s (%s).", exc, type(exc).__name__)

    def _drain_and_shut_down(self) -> None:
        from ray import serve

        if self.apps and self.drain is not None:
            try:
                self.drain()  # new requests for every model: 503 + Retry-After from now on
            except Exception as exc:
                log.warning("Telling the server to drain failed: %s", exc)
        # Models first (their replicas finish what they hold); the server-wide application goes last, or
        # with Serve itself when this server started it, so that it answers 503 until the port closes.
        deleting = self.apps[:-1] if self.started_serve else self.apps
        for name in deleting:  # all at once: each model's replicas drain on their own
            if self.abandoned:
                return
            try:
                serve.delete(name, _blocking=False)
            except Exception as exc:
                log.warning("Deleting the application %s failed: %s", name, exc)
        wait_deleted(deleting, left=lambda: self.abandoned)
        # Left behind (Ray gone, or a second signal): a Serve call now would wait on a dead head, or start a new
        # local Ray (Serve's own connect calls ray.init).
        if self.abandoned:
            return
        if self.started_serve:
            try:
                serve.shutdown()
                end_serve_leftovers()
            except Exception as exc:
                log.warning("Shutting down Serve failed: %s", exc)
        if self.started_ray and not self.abandoned:
            import ray

            self._ending_ray = True
            ray.shutdown()


def wait_deleted(names: list[str], wait_s: float = 60.0, left: Callable[[], bool] = lambda: False) -> None:
    """Until none of the applications ``names`` is listed by Serve any more (their replicas have finished what
    they held), ``wait_s``, or ``left()`` (the stop was left behind: no more Serve calls)."""
    from ray import serve

    deadline = time.monotonic() + wait_s
    while names and time.monotonic() < deadline and not left():
        try:
            listed = set(serve.status().applications)
        except Exception:  # Serve itself is gone: nothing is left to wait for
            return
        if not listed & set(names):
            return
        time.sleep(0.2)
    if names and time.monotonic() >= deadline:
        log.warning("Serve had not deleted %s after %g s; stopping on.", ", ".join(names), wait_s)


def end_serve_leftovers(wait_s: float = 30.0) -> list[str]:
    """After ``serve.shutdown()`` of the Serve this server started: wait until no actor of Serve's namespace
    is alive, then kill the ones still there; returns their names. ``serve.shutdown`` gives up after 30 s
    with a warning while its controller is still deleting replicas and proxies; a server started next on
    the same cluster would then join that dying Serve, or have its proxy reused with this one's config,
    or find its CPUs still held by these replicas (detached actors outlive this process)."""
    import ray
    from ray.serve._private.constants import SERVE_NAMESPACE

    def alive() -> list[str]:
        return [a["name"] for a in ray.util.list_named_actors(all_namespaces=True) if a["namespace"] == SERVE_NAMESPACE]

    deadline = time.monotonic() + wait_s
    while (left := alive()) and time.monotonic() < deadline:
        time.sleep(0.2)
    for name in left:
        try:
            ray.kill(ray.get_actor(name, namespace=SERVE_NAMESPACE), no_restart=True)
        except Exception:  # gone in between
            continue
    if left:
        log.warning(
            "Serve had not stopped %d of its actors %g s after shutdown; killed them: %s",
            len(left),
            wait_s,
            ", ".join(sorted(left)),
        )
    return left


def ray_environment(address: str | None) -> None:
    """Ray's environment for this server (``rayenv``), and for a local instance free ports for the two
    metrics exporters Ray puts on fixed ones, so two local servers do not collide. ``RAY_ENABLE_AUTO_CONNECT``
    0: a Ray call after this server's Ray stopped fails instead of starting a new local instance (Ray reads it
    when it is first imported, which in ``ortpilot serve`` is after this; Serve's own connect does not read it,
    so the stop makes no Serve call once it is left behind)."""
    rayenv.ray_environment(address)
    os.environ.setdefault("RAY_ENABLE_AUTO_CONNECT", "0")
    if not address:
        os.environ.setdefault("DASHBOARD_METRIC_PORT", str(fastpath.free_port()))
        os.environ.setdefault("AUTOSCALER_METRIC_PORT", str(fastpath.free_port()))


def _start_ray(address: str | None, cpus: int) -> tuple[bool, bool]:
    """(started Ray, Serve already running) after connecting to ``address`` or starting a local instance."""
    import ray

    if address:
        why = rayenv.unreachable(address, "--address")
        if why:
            raise UsageError(why)
        try:
            ray.init(address=address, log_to_driver=True, logging_level=logging.WARNING)
        except Exception as exc:  # ConnectionError, RuntimeError, ValueError: what Ray raises varies by version
            raise UsageError(rayenv.join_error(address, exc)) from None
        started = False
    else:
        # "local": a new instance even where RAY_ADDRESS names another one.
        ray.init(
            address="local",
            num_cpus=cpus,
            include_dashboard=False,
            dashboard_host="127.0.0.1",
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


def check_cpus(options: ServeOptions, models: int, server: ServerOptions) -> None:
    """Exit 2 before anything starts when the replicas would not all fit the CPUs of the local Ray instance
    this server starts (``ServeOptions.check_fit``); a joined cluster's CPUs are the cluster's."""
    if server.address:
        return
    from ortpilot.providers.cpubudget import this_budget

    options.check_fit(models, this_budget().cpus)


def check_ports(server: ServerOptions) -> None:
    """Exit 2 before anything starts when the HTTP or gRPC port is taken."""
    check_port(server.host, server.port)
    if server.grpc_port is not None:
        check_port(server.host, server.grpc_port, "--grpc-port")


@dataclass(frozen=True)
class GrpcEntry:
    """What Ray's gRPC proxy is given for ``--grpc-port`` (the stack's servicer; the OIP stack has one):
    the servicer registration's import path, the proxy callback that applies the stack's fixes there,
    and the application a call naming none is for."""

    servicer: str
    proxy_callback: str
    app: str = ""


def require_ray() -> Any:
    """Ray Serve, or exit 2 naming the extra to install."""
    try:
        from ray import serve
    except ImportError:
        raise UsageError(f"Serving needs Ray Serve: {INSTALL_HINT}.") from None
    return serve


START_ATTEMPTS = 3  # Serve is started again on new ports when one ortpilot picked itself was taken


def start_serve(
    serve: Any,
    server: ServerOptions,
    grpc: GrpcEntry | None,
    max_request_mb: float,
    protocol: str = OIP,
    text_models: Sequence[str] = (),
) -> fastpath.IngressPath:
    """``serve.start`` on the path ``server`` asks for; returns the path taken, its ports filled in.
    ``protocol`` (``oip``, ``openai``) shapes the errors HAProxy answers itself; ``grpc`` is what a
    ``--grpc-port`` serves (None: the stack serves no gRPC); ``text_models``' ``/v1`` requests go straight
    to their replicas (``fastpath.environment``). A port taken between its check and its
    bind is an exit 2 when the user chose it; one ortpilot picked (HAProxy's stats, Ray's fallback
    proxy) is picked again, up to ``START_ATTEMPTS`` starts."""
    attempt = 1
    while True:
        try:
            return _start_serve_once(serve, server, grpc, max_request_mb, protocol, text_models)
        except _PortTaken as taken:
            if taken.port in (server.port, server.grpc_port) or attempt == START_ATTEMPTS:
                raise UsageError(_port_taken(taken, server)) from None
            log.warning("%s was taken before Serve bound it; starting Serve again on other ports.", taken.address)
            serve.shutdown()
            end_serve_leftovers()
            attempt += 1


class _PortTaken(Exception):
    def __init__(self, address: str) -> None:
        super().__init__(address)
        self.address = address
        self.port = int(address.rsplit(":", 1)[-1])


def _start_serve_once(
    serve: Any,
    server: ServerOptions,
    grpc: GrpcEntry | None,
    max_request_mb: float,
    protocol: str,
    text_models: Sequence[str],
) -> fastpath.IngressPath:
    grpc = grpc if server.grpc_port is not None else None
    remote = _remote_hosts()
    path = fastpath.choose(server.ingress, server.throughput_optimized, remote, server.host)
    # Short: Ray adds a 56-character node id below it, and HAProxy takes socket paths of 97 characters.
    run_dir = Path(tempfile.mkdtemp(prefix="op-", dir="/tmp" if Path("/tmp").is_dir() else None))
    env, path = fastpath.environment(
        path,
        run_dir,
        server.timeouts,
        host=server.host,
        grpc_app=grpc.app if grpc else "",
        proxy_callback=grpc.proxy_callback if grpc else "",
        protocol=protocol,
        max_header_kb=server.max_header_kb,
        hide_routes=server.access.auth,
        text_models=text_models,
    )
    env["RAY_SERVE_GRPC_MAX_MESSAGE_SIZE"] = str(megabytes(max_request_mb))
    if server.loopback and not remote:
        env[fastpath.GRPC_LOOPBACK_ENV] = "1"
    if grpc:
        env[fastpath.GRPC_APP_ENV] = grpc.app  # Ray's proxies: the app a call naming none is for
    http = {"host": server.host, "port": server.port, "keep_alive_timeout_s": server.timeouts.idle_s}
    try:
        serve.start(
            http_options=http,
            grpc_options={"port": server.grpc_port, "grpc_servicer_functions": [grpc.servicer]} if grpc else None,
            logging_config=QUIET_LOGS,
            controller_options={"runtime_env": {"env_vars": env}},
        )
    except Exception as exc:
        shutil.rmtree(run_dir, ignore_errors=True)
        taken = _BIND_FAILED.search(str(exc))
        if taken:
            raise _PortTaken(taken.group(1) or taken.group(2)) from None
        hint = (
            f" Ray stops a proxy that is not ready within {fastpath.PROXY_CHECK_S} s: start serve again when "
            "the machine is less loaded."
            if "ActorDiedError" in type(exc).__name__
            else ""
        )
        raise VerificationError(
            f"Ray Serve did not start: {failure_reason(str(exc))} ({type(exc).__name__}).{hint}"
        ) from None
    return fastpath.IngressPath(**{**path.__dict__, "ports": {**path.ports, "run_dir": str(run_dir)}})


# Ray's proxy, and HAProxy on the fast path, when the port they were given is taken.
_BIND_FAILED = re.compile(
    r"Failed to bind to address '([^']+)'|cannot bind socket \(Address already in use\) for \[([^\]]+)\]"
)


def _port_taken(taken: _PortTaken, server: ServerOptions) -> str:
    """Why serve did not start when a Ray proxy found its port taken: ``check_ports`` saw it free moments
    before, so another process took it in between."""
    flag = {server.port: "--port", server.grpc_port: "--grpc-port"}.get(taken.port)
    which = f"{flag} {taken.port}" if flag else f"port {taken.port}, which ortpilot picked for Ray's own proxy"
    return (
        f"Ray Serve could not listen on {taken.address} ({which}): another process took the port after ortpilot "
        f"checked that it was free. Serve was stopped again and nothing is left running on the cluster; "
        f"start again{', or choose another ' + flag if flag else ''}."
    )


def _remote_hosts() -> bool:
    """Whether the cluster has alive nodes on other hosts than this driver's."""
    import ray

    try:
        here = ray.util.get_node_ip_address()
        return any(n["Alive"] and n["NodeManagerAddress"] != here for n in ray.nodes())
    except Exception:
        return False


def serve_until_stopped(
    build: Callable[[int], list[Any]],
    wait: Callable[[list[BaseException], threading.Event], R],
    server_options: ServerOptions,
    *,
    grpc: GrpcEntry | None = None,
    protocol: str = OIP,
    drain: Callable[[], None] | None = None,
    max_request_mb: float = DEFAULT_MAX_REQUEST_MB,
    on_ready: Callable[[R], None] | None = None,
    stop: threading.Event | None = None,
    joined: Callable[[], None] | None = None,
    text_models: Sequence[str] = (),
) -> R:
    """One server's life, for every server ``serve`` runs: start (or join, the options' ``address``) Ray
    and Serve on the ingress path the options ask for, deploy ``build(cpu_budget)`` (Ray Serve
    ``RunTarget`` records) in the background, ``wait(deploy_errors, stop)`` for its ready replicas,
    hand them to ``on_ready`` with the path taken, then serve until SIGINT/SIGTERM or ``stop``;
    exactly what this call started is drained (``drain``) and stopped again. ``joined`` runs when
    Serve already runs on the cluster (the caller's check that it can share that Serve). ``text_models``:
    the models whose OpenAI-style ``/v1`` text requests HAProxy hands straight to their replicas."""
    ray_environment(server_options.address)
    serve = require_ray()
    from ortpilot.providers.cpubudget import this_budget

    budget = this_budget().cpus
    server = Server()
    stop = stop or threading.Event()
    main = threading.current_thread() is threading.main_thread()
    # The caller's handlers, put back at the end (not the ones ray.init installs: they exit at once, and after
    # this server stopped its Ray they would run on nothing).
    callers = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)} if main else {}
    ready: Any = None
    try:
        before = processes.children()
        server.started_ray, serve_running = _start_ray(server_options.address, budget)
        if server.started_ray:  # what ray.init started: this process's children now that were not before
            server.ray_processes = {p: t for p, t in processes.children().items() if p not in before}
        if main:

            def on_signal(*_: Any) -> None:
                (server.hurry if stop.is_set() else stop).set()  # a second one: stop without the drain

            for sig in callers:  # after ray.init, which installs its own
                signal.signal(sig, on_signal)
        logging.getLogger("ray.serve").setLevel(logging.WARNING)
        if serve_running:
            if joined is not None:
                joined()
            path = fastpath.IngressPath(
                False,
                False,
                False,
                True,
                ("Serve already ran on this cluster: requests take the path it was started on",),
            )
        else:
            # Set first: a failed ``serve.start`` leaves its controller on the cluster, and the next server
            # there would join that broken Serve (on its ports, not its own) instead of starting one.
            server.started_serve = True
            path = start_serve(serve, server_options, grpc, max_request_mb, protocol, text_models)
            server.run_dir = Path(path.ports["run_dir"])
        targets = build(budget)
        deploy_error: list[BaseException] = []

        def deploy() -> None:
            try:
                serve.run_many(targets, wait_for_ingress_deployment_creation=False, wait_for_applications_running=False)
            except BaseException as exc:  # ``wait`` reports it, with the replica's reason where there is one
                deploy_error.append(exc)

        server.apps = [t.name for t in targets]
        server.drain = drain
        threading.Thread(target=deploy, name="ortpilot-deploy", daemon=True).start()
        ready = wait(deploy_error, stop)
        if hasattr(ready, "path"):
            ready.path = path
            ready.grpc = (
                server_options.netloc(server_options.grpc_port) if server_options.grpc_port is not None else None
            )
        if on_ready:
            on_ready(ready)
        while not stop.wait(0.5):
            pass
        return ready
    finally:
        try:
            server.stop()  # with this server's handlers still on: a second signal is the server's to take
            if hasattr(ready, "ray_left_behind"):
                ready.ray_left_behind = server.started_ray and server.abandoned
        finally:
            for sig, handler in callers.items():
                if handler is not None:  # None: a handler not set from Python, which cannot be put back
                    signal.signal(sig, handler)


__all__ = [
    "INSTALL_HINT",
    "GrpcEntry",
    "Server",
    "check_cpus",
    "check_port",
    "check_ports",
    "deployment_status",
    "end_serve_leftovers",
    "failure_reason",
    "http_get",
    "require_ray",
    "serve_applications",
    "serve_until_stopped",
    "start_serve",
]
