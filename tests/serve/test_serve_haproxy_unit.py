"""serve.haproxy and serve.fastpath without Ray: the wrapper's sed program run on a config written like
Ray's, the error pages in each protocol's shape, and the controller environment with its free ports."""

from __future__ import annotations

import contextlib
import http.client
import json
import shutil
import socket
import subprocess
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from serve_procs import free_port

from ortpilot.serve.fastpath import IngressPath, choose, environment, haproxy_binary, haproxy_version
from ortpilot.serve.haproxy import HAPROXY_BUFSIZE, RETRY_ON, write_wrapper
from ortpilot.serve.records import Timeouts

RAY_CFG = """global
    log 127.0.0.1:514 local0 info
    stats socket /tmp/admin.sock mode 666 level admin expose-fd listeners
defaults
    mode http
    timeout client 300s
    errorfile 502 /ray/500.http
    errorfile 503 /ray/500.http
    errorfile 504 /ray/500.http
frontend prometheus
    bind :9101
frontend http_frontend
    bind 127.0.0.1:8000
    http-request return status 200 content-type application/json string "{\\"/\\": \\"a\\"}" if routes
frontend grpc_frontend
    bind 127.0.0.1:9000
listen stats
    bind *:8404
backend default_backend
    http-request return status 404 content-type text/plain lf-string "Path %[path] not found"
"""

pytestmark = pytest.mark.skipif(shutil.which("sed") is None, reason="the wrapper runs GNU sed")


def _rewritten(tmp_path, protocol: str = "oip", **kwargs) -> str:
    folder = tmp_path / "h"
    folder.mkdir()
    wrapper = write_wrapper(folder, "/bin/true", Timeouts(7, 300, 11), protocol=protocol, **kwargs)
    cfg = folder / "haproxy.cfg"
    cfg.write_text(RAY_CFG)
    for _ in range(2):  # Ray runs it on every reload: the second run must change nothing
        subprocess.run([str(wrapper), "-f", str(cfg)], check=True)
    return cfg.read_text()


def test_the_wrapper_moves_listeners_to_loopback_and_adds_what_ray_leaves_out(tmp_path):
    cfg = _rewritten(tmp_path, max_header_kb=9, grpc_app="m", hide_routes=True)
    assert "bind 127.0.0.1:9101" in cfg and "bind 127.0.0.1:8404" in cfg and "bind *:" not in cfg
    assert "log 127.0.0.1:514" not in cfg and cfg.count("# ortpilot timeouts") == 1
    assert "timeout http-request 7s" in cfg and "timeout http-keep-alive 11s" in cfg
    assert "option http-buffer-request" in cfg
    assert f"if {{ req.hdrs,length gt {9 * 1024} }}" in cfg and "http-request return status 501" in cfg
    assert "set-header application m unless { req.hdr(application) -m found }" in cfg
    assert "/ray/500.http" not in cfg and "if routes" in cfg and "status 200 content-type application/json" not in cfg
    assert "application/json file" in cfg.split("backend default_backend")[1]


@pytest.mark.parametrize("protocol", ["oip", "openai"])
def test_haproxys_own_answers_speak_the_protocols_shape(tmp_path, protocol):
    _rewritten(tmp_path, protocol)
    folder = tmp_path / "h"
    page = (folder / "e503.http").read_bytes()
    head, _, doc = page.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 503") and b"Retry-After: 1" in head
    error = json.loads(doc)["error"]
    if protocol == "oip":
        assert isinstance(error, str) and "retry" in error
    else:
        assert error["type"] == "server_error" and error["code"] == "unavailable"
    assert "32 KiB (--max-header-kb)" in (folder / "e431.json").read_text()  # the default limit


def test_the_environment_chooses_free_ports_and_names_the_wrapper(tmp_path):
    path = IngressPath(haproxy=True, direct_ingress=True, throughput_optimized=True, uvloop=True)
    env, filled = environment(path, tmp_path, Timeouts(), host="127.0.0.1", grpc_app="m", proxy_callback="x:y")
    assert env["RAY_SERVE_ENABLE_HA_PROXY"] == "1" and env["RAY_SERVE_HAPROXY_RETRY_ON"] == RETRY_ON
    assert env["RAY_SERVE_HAPROXY_TUNE_BUFSIZE"] == str(HAPROXY_BUFSIZE)
    assert env["RAY_SERVE_HTTP_PROXY_CALLBACK_IMPORT_PATH"] == "x:y"
    assert (tmp_path / "h" / "haproxy").is_file() and env["RAY_SERVE_HAPROXY_BINARY_PATH"].endswith("/h/haproxy")
    low, high = map(int, filled.ports["replica_http"].split("-"))
    assert high - low + 1 == 64 and env["RAY_SERVE_DIRECT_INGRESS_MIN_HTTP_PORT"] == str(low)
    assert {"haproxy_stats", "haproxy_metrics", "fallback_proxy_http", "fallback_proxy_grpc"} <= set(filled.ports)
    proxy, _ = environment(IngressPath(False, False, True, True), tmp_path, Timeouts(), host="127.0.0.1")
    assert proxy["RAY_SERVE_ENABLE_DIRECT_INGRESS"] == "0" and "RAY_SERVE_HAPROXY_BINARY_PATH" not in proxy


def test_ingress_proxy_says_why():
    path = choose("proxy", throughput_optimized=True)
    assert not path.haproxy and any("--ingress proxy" in note for note in path.notes)
    assert path.describe().startswith("Ray Serve proxy -> replica")


@pytest.mark.parametrize("host", ["::1", "::"])
def test_an_ipv6_host_takes_the_classic_proxy_and_says_why(host):
    # Ray's HAProxy dials the replicas at the node's IPv4 address, and they listen on the IPv6 --host: every
    # request was a 503 and serve never became ready (measured with --host ::1 and --host ::)
    if not choose("auto", throughput_optimized=True).haproxy:
        pytest.skip("HAProxy cannot run here (no binary, or a Ray before the HAProxy ingress)")
    path = choose("auto", throughput_optimized=True, host=host)
    assert not path.haproxy and any(f"--host {host} is an IPv6 address" in note for note in path.notes)
    mapped = choose("auto", throughput_optimized=True, host="::ffff:127.0.0.1")  # an IPv4 address, written as IPv6
    assert mapped.haproxy and not any("IPv6" in note for note in mapped.notes)


# Requests with a valid request line and a header HAProxy refuses (RFC 9112: a request smuggler's tools).
BROKEN_HEADERS = {
    "two Host headers": b"GET /v2 HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n",
    "Content-Length -5": b"POST /v2 HTTP/1.1\r\nHost: a\r\nContent-Length: -5\r\n\r\n",
    "Content-Length abc": b"POST /v2 HTTP/1.1\r\nHost: a\r\nContent-Length: abc\r\n\r\n",
    "two Content-Lengths": b"POST /v2 HTTP/1.1\r\nHost: a\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\nab",
    "Transfer-Encoding xchunked": b"POST /v2 HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: xchunked\r\n\r\n",
    "obs-folded Transfer-Encoding": b"POST /v2 HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n x\r\n\r\n",
    "a NUL in a header": b"GET /v2 HTTP/1.1\r\nHost: a\r\nX-A: b\x00c\r\n\r\n",
    "a space before the colon": b"GET /v2 HTTP/1.1\r\nHost: a\r\nAuthorization : Bearer k\r\n\r\n",
}
MUX_ERRORFILES = (3, 3)  # the first HAProxy whose H1 mux answers these with the errorfile (haproxy#3032)


CFG_HEAD = "global\n    maxconn 100\ndefaults\n    mode http\n    timeout connect 5s\n    timeout client 30s\n    timeout server 30s\n"


def _binary() -> str:
    """The HAProxy ray[serve] installs (or one on the PATH); the test is skipped without one."""
    binary = haproxy_binary()
    if binary is None:
        pytest.skip("no HAProxy binary (ray[serve] installs one on Linux x86-64 and arm64)")
    return binary


def _stand_in(name: str, reached: list[tuple[str, str, int]]) -> ThreadingHTTPServer:
    """A stand-in replica on a free loopback port: records (its name, the path, the body's bytes) and answers 200."""

    class Replica(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_GET(self) -> None:
            size = len(self.rfile.read(int(self.headers.get("Content-Length") or 0)))
            reached.append((name, self.path, size))
            self.send_response(200)
            self.send_header("Content-Length", "0")
            self.end_headers()

        do_POST = do_GET

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Replica)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


@contextlib.contextmanager
def _running(wrapper, cfg, port: int):
    """HAProxy through the wrapper on ``cfg``, once it answers ``GET /ok`` through to a replica."""
    proc = subprocess.Popen([str(wrapper), "-f", str(cfg), "-db"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        for _ in range(100):
            try:
                if _answer(port, b"GET /ok HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n").startswith(
                    b"HTTP/1.1 200"
                ):
                    break
            except OSError:
                pass
            assert proc.poll() is None, proc.stderr.read().decode() if proc.stderr else ""
            time.sleep(0.1)
        yield proc
    finally:
        proc.terminate()
        proc.wait(10)


def _answer(port: int, raw: bytes) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(raw)
        chunks = []
        while chunk := sock.recv(65536):  # HAProxy closes the connection after its 400
            chunks.append(chunk)
    return b"".join(chunks)


@pytest.mark.parametrize("protocol", ["oip", "openai"])
def test_a_broken_header_is_haproxys_400_and_never_reaches_a_replica(tmp_path, protocol):
    """A real HAProxy (the one ray[serve] installs) with the wrapper's config in front of a stand-in replica:
    each broken header is a 400 that closes the connection and reaches no replica. Its body is the
    protocol's JSON error where HAProxy's H1 mux answers with the configured errorfile; HAProxy 2.8
    (Ray 2.60's) answers these parse errors with its compiled-in HTML page whatever the config says, so
    there the body check is an expected failure (docs/commands/serve.md says so)."""
    binary = _binary()
    reached: list[tuple[str, str, int]] = []
    replica = _stand_in("replica", reached)
    folder = tmp_path / "h"
    folder.mkdir()
    wrapper = write_wrapper(folder, binary, Timeouts(), protocol=protocol)
    port = free_port()
    cfg = folder / "haproxy.cfg"
    cfg.write_text(
        f"{CFG_HEAD}frontend http_frontend\n    bind 127.0.0.1:{port}\n    default_backend replica\n"
        f"backend replica\n    server r 127.0.0.1:{replica.server_address[1]}\n"
    )
    with _running(wrapper, cfg, port):
        answers = {case: _answer(port, raw) for case, raw in BROKEN_HEADERS.items()}
    replica.shutdown()
    assert [path for _, path, _ in reached] == ["/ok"]  # no broken request reached the replica
    for case, answer in answers.items():
        head, _, _ = answer.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 400") and b"Connection: close" in head, (case, answer[:300])
    bodies = {case: answer.partition(b"\r\n\r\n")[2] for case, answer in answers.items()}
    if (haproxy_version(binary) or (0, 0)) < MUX_ERRORFILES:
        assert all(b"<h1>400 Bad request</h1>" in body for body in bodies.values()), bodies
        pytest.xfail("HAProxy before 3.3 answers a request it cannot parse with its own HTML page (haproxy#3032)")
    for case, body in bodies.items():
        error = json.loads(body)["error"]
        message = error if protocol == "oip" else error["message"]
        assert "not valid HTTP" in message, (case, body)


# (path, body) -> (the backend that gets it, the path it gets): a text request naming a text model goes to that
# model's own route; anything else keeps its path and goes where Ray's prefixes send it.
TEXT_ROUTING = [
    ("/v1/embeddings", {"model": "embed", "input": "hi"}, ("embed", "/v2/models/embed/v1/embeddings")),
    (
        "/v1/rerank/?x=1",
        {"query": "q", "documents": ["d"], "model": "embed"},
        ("embed", "/v2/models/embed/v1/rerank/?x=1"),
    ),
    ("/v1/classify", {"model": "cls", "input": ["a", "b"]}, ("cls", "/v2/models/cls/v1/classify")),
    ("/v1/embeddings", {"model": "other", "input": "hi"}, ("server", "/v1/embeddings")),
    ("/v1/embeddings", {"model": "embedx", "input": "hi"}, ("server", "/v1/embeddings")),
    ("/v1/embeddings", {"input": "hi"}, ("server", "/v1/embeddings")),
    ("/v1/embeddings", {"model": 5, "input": "hi"}, ("server", "/v1/embeddings")),
    ("/v1/embeddings", b"not json", ("server", "/v1/embeddings")),
    ("/v1/completions", {"model": "embed", "prompt": "hi"}, ("server", "/v1/completions")),
    ("/v1/embeddingsx", {"model": "embed", "input": "hi"}, ("server", "/v1/embeddingsx")),
    ("/v2/models/embed/infer", {"inputs": []}, ("embed", "/v2/models/embed/infer")),
]


@pytest.mark.parametrize("one_hop", [True, False])
def test_text_requests_go_straight_to_the_model_their_body_names(tmp_path, one_hop):
    """A real HAProxy with the wrapper's config in front of stand-ins for two text models' replicas and the
    server-wide application, routed by path prefix as Ray writes it: with ``text_models`` a POST to
    /v1/embeddings (rerank, classify) whose JSON body names one of them reaches that model's own route, query
    and body intact; every other request keeps its path; without ``text_models`` nothing is rewritten."""
    binary = _binary()
    if (haproxy_version(binary) or (0, 0)) < (2, 4):
        pytest.skip("HAProxy before 2.4 has no json_query (the server keeps two hops)")
    reached: list[tuple[str, str, int]] = []
    backends = {name: _stand_in(name, reached) for name in ("embed", "cls", "server")}
    folder = tmp_path / "h"
    folder.mkdir()
    wrapper = write_wrapper(folder, binary, Timeouts(), text_models=("embed", "cls") if one_hop else ())
    port = free_port()
    prefixes = {"embed": "/v2/models/embed/", "cls": "/v2/models/cls/", "server": "/"}
    cfg = folder / "haproxy.cfg"
    cfg.write_text(
        f"{CFG_HEAD}frontend http_frontend\n    bind 127.0.0.1:{port}\n"
        + "".join(f"    acl is_{n} path_beg {p}\n" for n, p in prefixes.items())
        + "".join(f"    use_backend {n} if is_{n}\n" for n in prefixes)
        + "".join(f"backend {n}\n    server r 127.0.0.1:{b.server_address[1]}\n" for n, b in backends.items())
    )
    # Bodies over HAProxy's buffer (16 KiB here): the model is read where it is named in the buffered part.
    words = ["word " * 20] * 1000
    big = [
        ("/v1/embeddings", {"model": "embed", "input": words}, ("embed", "/v2/models/embed/v1/embeddings")),
        ("/v1/embeddings", {"input": words, "model": "embed"}, ("server", "/v1/embeddings")),
    ]
    sent = []
    with _running(wrapper, cfg, port):
        reached.clear()
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
        for path, doc, _ in [*TEXT_ROUTING, *big]:
            body = doc if isinstance(doc, bytes) else json.dumps(doc).encode()
            conn.request("POST", path, body, {"Content-Type": "application/json"})
            assert conn.getresponse().read() == b""
            sent.append(len(body))
    for server in backends.values():
        server.shutdown()
    assert [size for _, _, size in reached] == sent  # every body arrived whole
    for (path, _, expected), (name, got, _) in zip([*TEXT_ROUTING, *big], reached):
        if one_hop:
            assert (name, got) == expected, path
        else:
            assert got == path and name == ("embed" if path.startswith("/v2/models/embed/") else "server"), path
