"""The HAProxy wrapper ``ortpilot serve`` hands Ray (``RAY_SERVE_HAPROXY_BINARY_PATH``): a shell script
that edits the config Ray writes before every (re)load, and the error pages HAProxy answers with itself.

The edit (a GNU sed program) moves the listeners Ray binds on all interfaces onto loopback, adds the
timeouts and the header limit Ray leaves out, buffers a request's body (so a request whose replica
died can be replayed), and makes HAProxy's own answers (400, 404, 408, 431, 501, 503, 504) speak the
protocol's JSON shape (``errorbody``). Plain files, no Ray: the unit tests run the sed program on a
config written like Ray's.

Text requests take one hop. An OpenAI-style ``POST /v1/embeddings`` (``/rerank``, ``/classify``) names its
model in the body, so Ray's prefix routing sends it to the server-wide application, which relays it to a
replica of that model: a second hop (measured: 0.78x the requests/s of one hop at 32 clients).
With ``text_models`` the edit reads the buffered body's ``model`` (HAProxy's ``json_query``) and, where it
names one of them, rewrites the path to that model's own route (``/v2/models/NAME/v1/embeddings``), which
its replicas answer themselves; any other body (no model, another name, one larger than HAProxy's buffer,
not JSON) keeps its path and gets the server-wide application's answer as before.
"""

from __future__ import annotations

import stat
from collections.abc import Sequence
from pathlib import Path

from ortpilot.serve.defaults import DEFAULT_MAX_HEADER_KB
from ortpilot.serve.errorbody import OIP, error_json
from ortpilot.serve.records import Timeouts
from ortpilot.serve.textwire import ENDPOINTS, ROUTE_PREFIX

RETRY_ON = "conn-failure empty-response response-timeout"  # inference is idempotent: replay it
# L7 retries replay a request only when it fits HAProxy's buffer: 256 KiB covers JSON and binary
# bodies of models like MiniLM at 1x128; larger ones are retried only on connection failures.
HAPROXY_BUFSIZE = 256 * 1024
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


def text_routes(text_models: Sequence[str]) -> list[str]:
    """The frontend's rules that send a text request naming one of ``text_models`` (URL-safe names, as
    ``serve.options`` checks them) straight to that model's route: the body's ``model`` into a variable,
    then the path under ``/v2/models/NAME``, which Ray's prefix rules that follow route to the model."""
    if not text_models:
        return []
    paths = "|".join(p.lstrip("/") for p in ENDPOINTS)
    endpoint = f"{{ path -m reg ^{ROUTE_PREFIX}/({paths})/?$ }}"
    return [
        f"http-request set-var(txn.ortpilot_model) req.body,json_query('$.model') if METH_POST {endpoint}",
        "http-request set-path /v2/models/%[var(txn.ortpilot_model)]%[path] "
        f"if {endpoint} {{ var(txn.ortpilot_model) -m str {' '.join(text_models)} }}",
    ]


def rewrite_script(
    pages: dict[int, Path],
    timeouts: Timeouts,
    max_header_kb: int,
    hide_routes: bool = False,
    grpc_app: str = "",
    text_models: Sequence[str] = (),
) -> str:
    """The sed program (GNU sed -E) the wrapper runs on Ray's haproxy.cfg before every (re)load.

    ``grpc_app`` names the application a gRPC call without ``application`` metadata is for. The
    frontend writes that name into the call rather than picking a backend: each backend's backup
    server is Ray's fallback proxy, which (taking over while no replica of the app is up, as when
    one is killed and the other is busy) refuses a call without the name as soon as two apps exist.
    ``text_models``: the models whose ``/v1`` text requests go straight to their replicas (``text_routes``;
    HAProxy 2.4 or newer, which has ``json_query``)."""
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
    for rule in text_routes(text_models):
        lines += ["/^frontend http_frontend$/a\\", f"    {rule}"]
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
    protocol: str = OIP,
    max_header_kb: int = DEFAULT_MAX_HEADER_KB,
    hide_routes: bool = False,
    text_models: Sequence[str] = (),
) -> Path:
    """The HAProxy wrapper script in ``folder`` (the server's run folder), executable, with its sed program
    and error pages beside it."""
    pages = _write_pages(folder, protocol, timeouts, max_header_kb)
    (folder / "rewrite.sed").write_text(
        rewrite_script(pages, timeouts, max_header_kb, hide_routes, grpc_app, text_models)
    )
    path = folder / "haproxy"
    path.write_text(WRAPPER.replace("{folder}", str(folder)).replace("{binary}", binary))
    path.chmod(path.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return path


__all__ = ["HAPROXY_BUFSIZE", "METHODS", "RETRY_ON", "rewrite_script", "text_routes", "write_wrapper"]
