"""Serving throughput and latency: ``ortpilot serve`` (three configurations) against BentoML.

Closed-loop clients (each sends its next request when the last one returned) at concurrency 1,
8 and 32 against the demo encoder and MiniLM (1x128), for: (a) ortpilot serve, 1 replica, no
batching; (b) the same with dynamic batching (--max-batch 8); (c) 2 replicas x 1 CPU; (d) a
BentoML service (``benchmarks/bento_service.py`` in ``.venv-bento``, adaptive batching, max batch
8) wrapping a plain ORT session with the same profile's model and settings. All four servers run
at once (idle while another is measured) and the cells are interleaved: every round measures
each configuration at each concurrency, in an order that rotates per round; the table gives
medians over rounds. A bare in-process ``session.run`` of the same profile is timed in every
round, so the concurrency-1 p50 can be held against it (the Ray overhead per request).

    flock -x /tmp/ortpilot-cpu.lock .venv-test/bin/python benchmarks/bench_serve.py [--rounds 3] [--seconds 4]

Requests: ortpilot gets the Open Inference Protocol with binary tensors (what tritonclient
sends by default), BentoML its JSON (its client's default); each asks for one output (the
encoder's last_hidden_state, MiniLM's sentence_embedding). Access logs are off on both.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent
REPO = ROOT.parent
OUT = ROOT / "out" / "serve"
BENTO = REPO / ".venv-bento" / "bin" / "bentoml"
CONCURRENCY = (1, 8, 32)
MODELS = {
    "demo encoder": ("demo:encoder", "last_hidden_state"),
    "minilm": (str(ROOT / "models" / "minilm" / "model.onnx"), "sentence_embedding"),
}
ORTPILOT_CONFIGS = {
    "a: ortpilot 1 replica": ["--replicas", "1"],
    "b: ortpilot batching": ["--replicas", "1", "--max-batch", "8", "--batch-wait-ms", "2"],
    "c: ortpilot 2x1 CPU": ["--replicas", "2", "--cpus-per-replica", "1"],
}
BENTO_CONFIG = "d: BentoML batching"
ENV = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0", "PYTHONUNBUFFERED": "1", "BENTOML_DO_NOT_TRACK": "True"}


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def profile_for(name: str, model: str) -> Path:
    """A real tune output for the model (kept in benchmarks/out/serve/ and reused)."""
    out = OUT / name.replace(" ", "-")
    if not (out / "profile.json").is_file():
        from ortpilot.tuning import tune

        print(f"[bench_serve] tuning {name} (budget 20 s) into {out}", flush=True)
        tune(None if model == "demo:encoder" else model, out, budget_s=20, quantize=False)
    return out / "profile.json"


class Proc:
    """A server process started here and stopped by its PID."""

    def __init__(self, label: str, argv: list[str], port: int, env: dict[str, str], ready) -> None:
        self.label, self.port = label, port
        self.log = open(OUT / f"{label.split(':')[0]}-{port}.log", "wb")  # noqa: SIM115 - the server's log, closed in stop()
        self.proc = subprocess.Popen(argv, stdout=self.log, stderr=subprocess.STDOUT, env=env, cwd=REPO)
        deadline = time.monotonic() + 300
        while not ready(port):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"{label} did not start (see {self.log.name})")
            time.sleep(0.5)

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(120)
            except subprocess.TimeoutExpired:
                os.kill(self.proc.pid, signal.SIGKILL)
                self.proc.wait(30)
        self.log.close()


def _status(port: int, path: str) -> int:
    try:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
        conn.request("GET", path)
        return conn.getresponse().status
    except OSError:
        return 0


def oip_request(feeds: dict[str, np.ndarray], output: str) -> tuple[bytes, dict[str, str]]:
    """An infer body with binary tensors, as tritonclient.http builds it."""
    head = json.dumps(
        {
            "inputs": [
                {"name": k, "shape": list(v.shape), "datatype": "INT64", "parameters": {"binary_data_size": v.nbytes}}
                for k, v in feeds.items()
            ],
            "outputs": [{"name": output, "parameters": {"binary_data": True}}],
        }
    ).encode()
    body = head + b"".join(v.tobytes() for v in feeds.values())
    return body, {"Inference-Header-Content-Length": str(len(head)), "Content-Type": "application/octet-stream"}


def bento_request(feeds: dict[str, np.ndarray]) -> tuple[bytes, dict[str, str]]:
    tokens = np.stack([feeds[k] for k in ("input_ids", "attention_mask", "token_type_ids")])
    return json.dumps({"tokens": tokens.tolist()}).encode(), {"Content-Type": "application/json"}


def closed_loop(
    port: int, path: str, body: bytes, headers: dict[str, str], concurrency: int, seconds: float
) -> dict[str, float]:
    """``concurrency`` clients, each with one keep-alive connection, for ``seconds`` after a short warmup."""
    latencies: list[float] = []
    errors = [0]
    lock = threading.Lock()
    start = time.perf_counter()
    warm, end = start + 0.5, start + 0.5 + seconds

    def client() -> None:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
        mine = []
        while True:
            t0 = time.perf_counter()
            if t0 >= end:
                break
            try:
                conn.request("POST", path, body, headers)
                resp = conn.getresponse()
                resp.read()
                ok = resp.status == 200
            except (OSError, http.client.HTTPException):
                ok = False
                conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
            t1 = time.perf_counter()
            if not ok:
                with lock:
                    errors[0] += 1
            elif t0 >= warm and t1 <= end:
                mine.append(t1 - t0)
        with lock:
            latencies.extend(mine)

    threads = [threading.Thread(target=client, daemon=True) for _ in range(concurrency)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    lat = np.array(latencies) * 1000
    return {
        "rps": len(lat) / seconds,
        "p50": float(np.percentile(lat, 50)) if len(lat) else float("nan"),
        "p99": float(np.percentile(lat, 99)) if len(lat) else float("nan"),
        "errors": errors[0],
    }


def bare_p50(profile: Path, feeds: dict[str, np.ndarray], runs: int = 200) -> float:
    import ortpilot

    sess = ortpilot.load_profile(profile)
    for _ in range(20):
        sess.run(None, feeds)
    times = []
    for _ in range(runs):
        t0 = time.perf_counter()
        sess.run(None, feeds)
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=4.0)
    parser.add_argument("--models", nargs="*", default=list(MODELS))
    args = parser.parse_args()
    OUT.mkdir(parents=True, exist_ok=True)
    if not BENTO.is_file():
        sys.exit(f"BentoML is not installed at {BENTO}: see benchmarks/README.md (.venv-bento)")
    from ortpilot.graph.feeds import make_feeds
    from ortpilot.modelio import load_model

    results: dict[str, dict] = {}
    for name in args.models:
        model, output = MODELS[name]
        profile = profile_for(name, model)
        # Ctrl-C or SIGTERM stop the servers this script started (tune keeps its own SIGINT handler).
        signal.signal(signal.SIGINT, signal.default_int_handler)
        signal.signal(signal.SIGTERM, signal.default_int_handler)
        doc = json.loads(profile.read_text())
        feeds = make_feeds(load_model(profile.parent / doc["model"]["file"]), seed=0)
        servers: dict[str, Proc] = {}
        try:
            for label, extra in ORTPILOT_CONFIGS.items():
                port = free_port()
                servers[label] = Proc(
                    label,
                    [
                        sys.executable,
                        "-m",
                        "ortpilot.cli.main",
                        "serve",
                        str(profile),
                        "--name",
                        "m",
                        "--port",
                        str(port),
                        "--no-access-log",
                        *extra,
                    ],
                    port,
                    ENV,
                    lambda p: _status(p, "/v2/health/ready") == 200,
                )
            port = free_port()
            servers[BENTO_CONFIG] = Proc(
                BENTO_CONFIG,
                [
                    str(BENTO),
                    "serve",
                    "bento_service:Encoder",
                    "--port",
                    str(port),
                    "--host",
                    "127.0.0.1",
                    "--working-dir",
                    str(ROOT),
                ],
                port,
                {
                    **ENV,
                    "BENCH_PROFILE": str(profile),
                    "BENCH_OUTPUT": output,
                    "BENTOML_CONFIG_OPTIONS": "api_server.logging.access.enabled=false",
                },
                lambda p: _status(p, "/readyz") == 200,
            )
            requests = {label: ("/v2/models/m/infer", *oip_request(feeds, output)) for label in ORTPILOT_CONFIGS}
            requests[BENTO_CONFIG] = ("/infer", *bento_request(feeds))
            for label, (path, body, headers) in requests.items():  # warm every server up, outside the clock
                closed_loop(servers[label].port, path, body, headers, 4, 1.0)
            cells: dict[tuple[str, int], list[dict]] = {}
            bare: list[float] = []
            labels = list(requests)
            for r in range(args.rounds):
                bare.append(bare_p50(profile, feeds))
                order = labels[r % len(labels) :] + labels[: r % len(labels)]
                for conc in CONCURRENCY:
                    for label in order:
                        path, body, headers = requests[label]
                        cell = closed_loop(servers[label].port, path, body, headers, conc, args.seconds)
                        cells.setdefault((label, conc), []).append(cell)
                        print(
                            f"[bench_serve] {name} round {r + 1} {label} c={conc}: {cell['rps']:.1f} req/s "
                            f"p50 {cell['p50']:.2f} ms p99 {cell['p99']:.2f} ms errors {cell['errors']}",
                            flush=True,
                        )
        finally:
            for server in servers.values():
                server.stop()
        results[name] = {
            "bare_p50_ms": statistics.median(bare),
            "profile_threads": doc["session_settings"]["intra_op_threads"],
            "cells": {
                f"{label}|{conc}": {k: statistics.median(c[k] for c in runs) for k in runs[0]}
                for (label, conc), runs in cells.items()
            },
        }
    (OUT / "bench_serve.json").write_text(json.dumps(results, indent=2))
    print(f"load average after: {os.getloadavg()}")
    for name, res in results.items():
        print(
            f"\n### {name}: bare in-process session.run p50 {res['bare_p50_ms']:.2f} ms "
            f"(profile intra-op threads {res['profile_threads']})\n"
        )
        print(
            "| configuration | c=1 req/s | c=1 p50 ms | c=1 p99 ms | c=8 req/s | c=8 p50 | c=8 p99 | "
            "c=32 req/s | c=32 p50 | c=32 p99 |"
        )
        print("|---|---|---|---|---|---|---|---|---|---|")
        for label in list(ORTPILOT_CONFIGS) + [BENTO_CONFIG]:
            row = [label]
            for conc in CONCURRENCY:
                cell = res["cells"][f"{label}|{conc}"]
                row += [f"{cell['rps']:.1f}", f"{cell['p50']:.2f}", f"{cell['p99']:.2f}"]
            print("| " + " | ".join(row) + " |")


if __name__ == "__main__":
    main()
