"""Real slow and malformed clients on raw sockets, for the serve tests: a body shorter than its
Content-Length, headers sent a byte at a time, an idle kept-alive connection, oversized headers, and
the same over HTTP/2 for gRPC (hand-made frames: the connection preface, a HEADERS frame with
literal HPACK fields, a DATA frame that stops in the middle of a gRPC message).

Each returns what the server did and when, or ``None`` for "still open after ``wait`` seconds".
"""

from __future__ import annotations

import json
import socket
import struct
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

WAIT_S = 30.0  # longer than any timeout the tests configure: a server that never answers is caught


@dataclass
class Outcome:
    seconds: float | None  # until the server answered and closed (None: it did neither within the wait)
    status: int | None  # the HTTP status it answered with (None: it closed without an answer)
    body: bytes = b""

    def json(self) -> dict:
        return json.loads(self.body)


def side_by_side(jobs: dict[str, Callable[[], Any]]) -> dict[str, Any]:
    """Each job's result, the jobs run at once (each waits for a timeout of the server's)."""
    results: dict[str, Any] = {}
    threads = [threading.Thread(target=lambda n=n, j=j: results.__setitem__(n, j())) for n, j in jobs.items()]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(WAIT_S + 30)
    return results


def _connect(port: int) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", port), timeout=WAIT_S)
    sock.settimeout(WAIT_S)
    return sock


def _receive(sock: socket.socket, enough: Callable[[bytes], bool] = lambda _data: False) -> tuple[bytes, bool]:
    """(what the server sent until it closed the connection or ``enough`` of it came, whether it did either
    within the wait); the socket is closed after."""
    data = b""
    try:
        while not enough(data):
            chunk = sock.recv(65536)
            if not chunk:
                break
            data += chunk
    except TimeoutError:
        return data, False
    except OSError:
        pass
    finally:
        sock.close()
    return data, True


def _until_closed(sock: socket.socket, started: float) -> Outcome:
    data, ended = _receive(sock)
    return Outcome(time.monotonic() - started if ended else None, _status(data), _body(data))


def _status(data: bytes) -> int | None:
    if not data.startswith(b"HTTP/1."):
        return None
    return int(data.split(b" ", 2)[1])


def _body(data: bytes) -> bytes:
    return data.partition(b"\r\n\r\n")[2]


def request_head(method: str, path: str, headers: dict[str, str], length: int | None = None) -> bytes:
    lines = [f"{method} {path} HTTP/1.1", "Host: 127.0.0.1", *(f"{k}: {v}" for k, v in headers.items())]
    if length is not None:
        lines.append(f"Content-Length: {length}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


def short_body(port: int, path: str, headers: dict[str, str], sent: bytes = b'{"inputs": [') -> Outcome:
    """POST announcing 1000 body bytes, sending a few, then waiting."""
    sock = _connect(port)
    started = time.monotonic()
    sock.sendall(request_head("POST", path, {"Content-Type": "application/json", **headers}, 1000) + sent)
    return _until_closed(sock, started)


def dribble(port: int, path: str = "/v2/health/live", interval: float = 0.5) -> Outcome:
    """A request line and headers sent one byte every ``interval`` seconds (slowloris)."""
    sock = _connect(port)
    started = time.monotonic()
    try:
        for byte in request_head("GET", path, {"X-Slow": "x" * 60}):
            sock.send(bytes([byte]))
            time.sleep(interval)
    except OSError:
        pass  # the server closed the connection while we were still sending: what it should do
    return _until_closed(sock, started)


def idle_after_request(port: int, path: str, headers: dict[str, str]) -> Outcome:
    """One request on a kept-alive connection, then silence: when does the server close it?"""
    sock = _connect(port)
    sock.sendall(request_head("GET", path, headers))
    answer = sock.recv(65536)
    started = time.monotonic()
    outcome = _until_closed(sock, started)
    return Outcome(outcome.seconds, _status(answer), _body(answer))


def idle_connection(port: int) -> Outcome:
    """A connection that never sends a byte."""
    sock = _connect(port)
    return _until_closed(sock, time.monotonic())


def big_headers(port: int, path: str, size: int) -> Outcome:
    sock = _connect(port)
    started = time.monotonic()
    try:
        sock.sendall(request_head("GET", path, {"X-Big": "a" * size}))
    except OSError:
        pass
    return _until_closed(sock, started)


def one_request(port: int, method: str, path: str, headers: dict[str, str]) -> Outcome:
    """One request with any method (``FOO``, which HTTP client libraries will not send) on a connection
    the client asks to close after it."""
    sock = _connect(port)
    started = time.monotonic()
    sock.sendall(request_head(method, path, {"Connection": "close", **headers}))
    return _until_closed(sock, started)


# -- HTTP/2 (gRPC) ------------------------------------------------------------------------------------
PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
DATA, HEADERS, RST_STREAM, SETTINGS, GOAWAY = 0, 1, 3, 4, 7


def frame(kind: int, flags: int, stream: int, payload: bytes) -> bytes:
    return struct.pack(">I", len(payload))[1:] + bytes([kind, flags]) + struct.pack(">I", stream) + payload


def _literal(name: str, value: str) -> bytes:
    """An HPACK "literal header field without indexing, new name" (no Huffman): both under 127 bytes."""
    raw_name, raw_value = name.encode(), value.encode()
    return b"\x00" + bytes([len(raw_name)]) + raw_name + bytes([len(raw_value)]) + raw_value


def _frames(data: bytes) -> list[tuple[int, int]]:
    out, i = [], 0
    while i + 9 <= len(data):
        length = int.from_bytes(data[i : i + 3], "big")
        out.append((data[i + 3], int.from_bytes(data[i + 5 : i + 9], "big") & 0x7FFFFFFF))
        i += 9 + length
    return out


def grpc_idle(port: int) -> Outcome:
    """An HTTP/2 connection that sends its preface and settings, then nothing."""
    sock = _connect(port)
    sock.sendall(PREFACE + frame(SETTINGS, 0, 0, b""))
    return _until_closed(sock, time.monotonic())


def grpc_truncated(port: int, method: str = "/inference.GRPCInferenceService/ModelInfer") -> tuple[float | None, list]:
    """A gRPC call whose message announces 1000 bytes and brings 10, then waits: (seconds until the server
    ended the stream or the connection, the (type, stream) of every frame it sent)."""
    sock = _connect(port)
    fields = [
        (":method", "POST"),
        (":scheme", "http"),
        (":path", method),
        (":authority", f"127.0.0.1:{port}"),
        ("content-type", "application/grpc"),
        ("te", "trailers"),
    ]
    headers = b"".join(_literal(k, v) for k, v in fields)
    message = b"\x00" + struct.pack(">I", 1000) + b"x" * 10
    started = time.monotonic()
    sock.sendall(PREFACE + frame(SETTINGS, 0, 0, b"") + frame(HEADERS, 0x4, 1, headers) + frame(DATA, 0, 1, message))

    def answered(data: bytes) -> bool:
        frames = _frames(data)
        return any(s == 1 and k in (HEADERS, RST_STREAM) for k, s in frames) or any(k == GOAWAY for k, _ in frames)

    data, ended = _receive(sock, answered)
    return (time.monotonic() - started if ended else None), _frames(data)
