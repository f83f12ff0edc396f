"""Where one client's request time goes inside ``ortpilot serve``'s model replica: a ``py-spy`` sample.

Starts ``ortpilot serve`` (its default fast path, 1 replica: ``bench_serve.py``'s ``fast``) on the demo
encoder's profile that ``bench_serve.py`` tunes and keeps (``benchmarks/out/serve/demo-encoder/``), drives it with
``--clients`` closed-loop clients (KServe v2 JSON body, 1x128), records the replica process with ``py-spy``
for ``--seconds`` and sorts the samples in three: ORT's ``session.run``, ortpilot's own code (with
what it calls: numpy, orjson) and the rest (Ray Serve, uvicorn, asyncio, Ray's threads); then
ortpilot's share by its innermost module (``serve/pipeline.py``, ``serve/oip/codec.py``, ...), the
figure to compare between two commits.

    flock -x /tmp/ortpilot-cpu.lock .venv-test/bin/python benchmarks/profile_serve.py [--seconds 20] [--clients 32]
"""

from __future__ import annotations

import argparse
import collections
import http.client
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
from bench_serve import OUT, oip_request, profile_for, start_ortpilot

PY_SPY = Path(sys.executable).parent / "py-spy"


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


def ortpilot_modules(raw: Path) -> dict[str, int]:
    """Samples per ortpilot module, each sample charged to the innermost ortpilot frame of its stack
    (so ``serve/oip/replica.py`` holds only what it does itself, not the session run under it)."""
    modules: collections.Counter[str] = collections.Counter()
    for line in raw.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        mine = [f for f in stack.split(";") if "ortpilot/" in f]
        if mine and not any("onnxruntime/capi" in f for f in stack.split(";")[-2:]):
            where = mine[-1].split("ortpilot/", 1)[1]
            modules[where.split(":", 1)[0].rstrip(")")] += int(count)
    return dict(modules)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--seconds", type=int, default=20)
    parser.add_argument("--clients", type=int, default=1)
    parser.add_argument("--out", default=str(OUT / "replica-pyspy.txt"))
    args = parser.parse_args()
    OUT.mkdir(parents=True, exist_ok=True)
    server = start_ortpilot("fast", profile_for("demo encoder", "demo:encoder"), grpc=False)
    port = server.port
    try:
        found = subprocess.run(["pgrep", "-f", "ServeReplica:m"], capture_output=True, text=True).stdout.split()
        pid = int(found[0])
        names = ("input_ids", "attention_mask", "token_type_ids")
        body, headers = oip_request({n: np.ones((1, 128), np.int64) for n in names}, "last_hidden_state", binary=False)
        stop, latencies = threading.Event(), []

        def client() -> None:
            conn = http.client.HTTPConnection("127.0.0.1", port)
            while not stop.is_set():
                started = time.perf_counter()
                conn.request("POST", "/v2/models/m/infer", body, headers)
                reply = conn.getresponse()
                reply.read()
                latencies.append(time.perf_counter() - started)

        threads = [threading.Thread(target=client) for _ in range(args.clients)]
        for thread in threads:
            thread.start()
        time.sleep(3)
        spy = [str(PY_SPY), "record", "-p", str(pid), "-d", str(args.seconds), "-r", "500", "-f", "raw"]
        subprocess.run([*spy, "-o", args.out, "--nonblocking", "--threads"], check=True, capture_output=True)
        stop.set()
        for thread in threads:
            thread.join()
    finally:
        server.stop()
    parts = classify(Path(args.out))
    total = sum(parts.values())
    print(
        f"{args.clients} client(s): {len(latencies)} requests, p50 {np.median(latencies) * 1e3:.2f} ms "
        "(py-spy sampling at 500 Hz)"
    )
    for part, count in sorted(parts.items(), key=lambda kv: -kv[1]):
        print(f"{part}: {count} samples, {100 * count / total:.1f} %")
    for module, count in sorted(ortpilot_modules(Path(args.out)).items(), key=lambda kv: -kv[1])[:12]:
        print(f"  ortpilot {module}: {count} samples, {100 * count / total:.1f} %")


if __name__ == "__main__":
    main()
