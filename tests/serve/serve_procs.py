"""An ``ortpilot serve`` process for the serve tests: started on a free 127.0.0.1 port, stopped by PID."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

from ortpilot.serve.defaults import DEFAULT_READY_TIMEOUT_S

# Lean Ray on loopback only: no usage stats, access lines not deduplicated, and Ray's single-machine
# mode (without it Ray rewrites 127.0.0.1 to this machine's network address when joining).
RAY_ENV = {
    "RAY_USAGE_STATS_ENABLED": "0",
    "RAY_DEDUP_LOGS": "0",
    "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0",
    "PYTHONUNBUFFERED": "1",
}
READY = re.compile(r"^[\w.-]+: \d+ replicas? ready on ")
INGRESS = re.compile(r"^ingress: ")  # the last line serve prints once ready: the path requests take
CLI = [sys.executable, "-m", "ortpilot.cli.main"]
# A test waits longer than the server's own ready timeout, so a server that never gets ready exits with
# its reason (what the model still lacked) in the stderr the test shows, rather than being cut off first.
WAIT_READY_S = DEFAULT_READY_TIMEOUT_S + 60


def local_cluster(head_cpus: int, *workers: int):
    """A Ray cluster on this machine (``ray.cluster_utils.Cluster``, loopback, no dashboard): a head offering
    ``head_cpus`` and one more node per entry of ``workers`` (its CPUs); returns it and those nodes."""
    for key, value in RAY_ENV.items():
        os.environ.setdefault(key, value)
    from ray.cluster_utils import Cluster

    cluster = Cluster(
        initialize_head=True,
        connect=False,
        head_node_args={"num_cpus": head_cpus, "include_dashboard": False, "node_ip_address": "127.0.0.1"},
    )
    nodes = [cluster.add_node(num_cpus=n, node_ip_address="127.0.0.1") for n in workers]
    if nodes:
        cluster.wait_for_nodes()
    return cluster, nodes


def cli_env() -> dict[str, str]:
    """The environment an ``ortpilot`` command of a test runs in: this one's, lean and quiet, but without the
    single-machine switch, which the command sets itself for a loopback address (``ortpilot.rayenv``)."""
    env = {**os.environ, **RAY_ENV}
    env.pop("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER")
    return env


# What docs/commands/serve.md ("A dying replica") tells gRPC clients to set: a call whose replica died
# holding its HTTP/2 stream is refused by HAProxy (REFUSED_STREAM, status UNAVAILABLE, nothing ran) or
# reset mid-call (RST_STREAM CANCEL, status CANCELLED), and gRPC's own retry policy sends it again
# (inference is idempotent). Triton's defaults (no message size limits) kept.
GRPC_RETRY_CHANNEL_ARGS = [
    ("grpc.max_send_message_length", 2**31 - 1),
    ("grpc.max_receive_message_length", 2**31 - 1),
    ("grpc.enable_retries", 1),
    (
        "grpc.service_config",
        '{"methodConfig": [{"name": [{"service": "inference.GRPCInferenceService"}], "retryPolicy": '
        '{"maxAttempts": 3, "initialBackoff": "0.2s", "maxBackoff": "1s", "backoffMultiplier": 2, '
        '"retryableStatusCodes": ["UNAVAILABLE", "CANCELLED"]}}]}',
    ),
]


# Ports for the servers tests start: below Linux's ephemeral range (32768-60999), where every process that
# asks for "any port" (a Ray instance starting in the other xdist worker, an outgoing connection) gets one,
# and above 20000-30000, where ``ortpilot serve`` puts its replicas' ranges. A port picked from the
# ephemeral range was once taken in the seconds between the pick and Ray's proxy binding it (CI,
# "Failed to bind to address"). Each xdist worker draws from its own half, so two never pick one port.
TEST_PORTS = range(30000, 32768)
_picked: set[int] = set()


def free_port() -> int:
    """A port free on 127.0.0.1 now, from this worker's share of ``TEST_PORTS``, not handed out before
    in this process (a stopped server's port may linger in TIME_WAIT)."""
    worker = int(re.sub(r"\D", "", os.environ.get("PYTEST_XDIST_WORKER", "")) or 0)
    workers = max(int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1")), worker + 1)
    share = TEST_PORTS[worker::workers]
    start = int(time.monotonic_ns() // 1000) % len(share)
    for port in (*share[start:], *share[:start]):
        if port in _picked:
            continue
        with socket.socket() as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue
        _picked.add(port)
        return port
    raise OSError(f"no free port left in {TEST_PORTS} for this test worker")


# HAProxy's answer for an `application` header it has no gRPC route for (Ray's default_grpc_backend)
NO_ROUTE = "not found. Ping /ray.serve.RayServeAPIService/ListApplications"


def routed(call, timeout_s: float = 30.0):
    """``call()``'s result once HAProxy routes it: a gRPC call that HAProxy answers NOT_FOUND for want of a
    route is made again (for up to ``timeout_s``). CI saw one such answer for a model whose route had
    answered at readiness moments before (HAProxy rebuilds its routes from Ray's target broadcasts); any
    other error, or no route by the deadline, is raised."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            return call()
        except Exception as exc:
            if NO_ROUTE not in str(exc) or time.monotonic() > deadline:
                raise
            time.sleep(0.5)


def refused(call, payload: bytes, metadata=None):
    """The ``grpc.RpcError`` that ``call`` answers ``payload`` with, once HAProxy routes it (``routed``); an
    AssertionError when it answers without one."""

    def once():
        import grpc

        try:
            call(payload, metadata=metadata, timeout=60)
        except grpc.RpcError as error:
            if NO_ROUTE in (error.details() or ""):
                raise
            return error
        raise AssertionError("the call was answered without an error")

    return routed(once)


class Server:
    """An ``ortpilot serve`` process: its URL, the ready lines it printed, its stderr so far."""

    def __init__(
        self,
        args: list[str],
        port: int,
        log: Path,
        timeout: float = WAIT_READY_S,
        env: dict[str, str] | None = None,
        new_session: bool = False,
    ) -> None:
        self.port = port
        self.url = f"127.0.0.1:{port}"
        self.log = log
        self._err = open(log, "wb")  # noqa: SIM115 - the server's stderr, closed when it is stopped
        env = {**cli_env(), **(env or {})}
        self.proc = subprocess.Popen(
            [*CLI, "serve", *args, "--port", str(port)],
            stdout=subprocess.PIPE,
            stderr=self._err,
            env=env,
            start_new_session=new_session,  # its own process group, as a terminal or a process manager gives it
        )
        self.ready: list[str] = []
        self.ingress = ""
        self._lines: list[str] = []
        threading.Thread(target=self._read, daemon=True).start()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and self.proc.poll() is None:
            if self.ingress:
                break
            time.sleep(0.2)
        self.ready = list(self._lines)

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for raw in self.proc.stdout:  # Ray forwards its own log lines here too: keep the ready lines
            line = raw.decode(errors="replace").rstrip("\n")
            if READY.match(line):
                self._lines.append(line)
            elif INGRESS.match(line):
                self.ingress = line

    @property
    def stderr(self) -> str:
        self._err.flush()
        return self.log.read_text(errors="replace")

    def stop(self, timeout: float = 90.0) -> int:
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                os.kill(self.proc.pid, signal.SIGKILL)
                self.proc.wait(30)
        self._err.close()
        return self.proc.returncode
