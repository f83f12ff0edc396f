"""Where one client's request time goes inside ``ortpilot serve``'s model replica: a ``py-spy`` sample.

Starts ``ortpilot serve`` (its default fast path, 1 replica) on the demo encoder's profile from
``bench_serve.py`` (``benchmarks/out/serve/demo-encoder/profile.json``; run that first), drives it with
one closed-loop client (KServe v2 JSON body, 1x128), records the replica process with ``py-spy``
for ``--seconds`` and sorts the samples in three: ORT's ``session.run``, ortpilot's own code (with
what it calls: numpy, orjson) and the rest (Ray Serve, uvicorn, asyncio, Ray's threads).

    flock -x /tmp/ortpilot-cpu.lock .venv-test/bin/python benchmarks/profile_serve.py [--seconds 20]
"""

from __future__ import annotations

import argparse
import collections
import http.client
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent
PROFILE = ROOT / "out" / "serve" / "demo-encoder" / "profile.json"
PY_SPY = Path(sys.executable).parent / "py-spy"


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _status(port: int, path: str) -> int:
    try:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
        conn.request("GET", path)
        return conn.getresponse().status
    except OSError:
        return 0


def classify(raw: Path) -> dict[str, int]:
    """Samples per part, from py-spy's raw (folded) output: one ``frame;frame;... count`` per line."""
    parts: collections.Counter[str] = collections.Counter()
    for line in raw.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack:
            continue
        frames = stack.split(";")
        if any("onnxruntime/capi" in f for f in frames[-2:]):
            parts["ORT session.run"] += int(count)
        elif any("ortpilot/" in f for f in frames):
            parts["ortpilot's code (and numpy, orjson under it)"] += int(count)
        else:
            parts["Ray Serve, uvicorn, asyncio, Ray's threads"] += int(count)
    return dict(parts)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--seconds", type=int, default=20)
    parser.add_argument("--out", default=str(ROOT / "out" / "serve" / "replica-pyspy.txt"))
    args = parser.parse_args()
    port = _free_port()
    log = open(ROOT / "out" / "serve" / f"profile-{port}.log", "wb")  # noqa: SIM115 - closed with the server
    argv = [sys.executable, "-m", "ortpilot.cli.main", "serve", str(PROFILE), "--name", "m", "--port", str(port)]
    env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0"}
    server = subprocess.Popen([*argv, "--no-access-log"], stdout=log, stderr=subprocess.STDOUT, env=env)
    try:
        deadline = time.monotonic() + 180
        while _status(port, "/v2/health/ready") != 200:
            if server.poll() is not None or time.monotonic() > deadline:
                sys.exit(f"ortpilot serve did not start (see {log.name})")
            time.sleep(0.5)
        found = subprocess.run(["pgrep", "-f", "ServeReplica:m"], capture_output=True, text=True).stdout.split()
        pid = int(found[0])
        tensor = {"shape": [1, 128], "datatype": "INT64", "data": [1] * 128}
        names = ("input_ids", "attention_mask", "token_type_ids")
        body = json.dumps(
            {"inputs": [{"name": n, **tensor} for n in names], "outputs": [{"name": "last_hidden_state"}]}
        ).encode()
        stop, latencies = threading.Event(), []

        def client() -> None:
            conn = http.client.HTTPConnection("127.0.0.1", port)
            while not stop.is_set():
                started = time.perf_counter()
                conn.request("POST", "/v2/models/m/infer", body, {"Content-Type": "application/json"})
                reply = conn.getresponse()
                reply.read()
                latencies.append(time.perf_counter() - started)

        thread = threading.Thread(target=client)
        thread.start()
        time.sleep(3)
        spy = [str(PY_SPY), "record", "-p", str(pid), "-d", str(args.seconds), "-r", "500", "-f", "raw"]
        subprocess.run([*spy, "-o", args.out, "--nonblocking", "--threads"], check=True, capture_output=True)
        stop.set()
        thread.join()
    finally:
        os.kill(server.pid, signal.SIGTERM)
        server.wait(120)
        log.close()
    parts = classify(Path(args.out))
    total = sum(parts.values())
    print(f"one client: {len(latencies)} requests, p50 {np.median(latencies) * 1e3:.2f} ms (py-spy sampling at 500 Hz)")
    for part, count in sorted(parts.items(), key=lambda kv: -kv[1]):
        print(f"{part}: {count} samples, {100 * count / total:.1f} %")


if __name__ == "__main__":
    main()
