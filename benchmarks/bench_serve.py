"""Serving throughput and latency: ``ortpilot serve`` against a Starlette floor, BentoML and bare ``session.run``.

Closed-loop clients (each sends its next request when the last one returned) at concurrency 1,
8 and 32 against the demo encoder and MiniLM (1x128). Configurations (``--configs``):

- ``fast``: ``ortpilot serve``, 1 replica, on its default path (HAProxy -> replica, direct ingress,
  throughput-optimized); ``fast-batch``: the same with ``--max-batch 8``; ``fast-2x1``: 2 replicas x
  1 CPU; ``proxy``: Ray Serve's classic proxy, throughput-optimized off (the one-hop path without any
  fast-path switch); ``proxy-to``: classic proxy, throughput-optimized on; ``haproxy-noto``: HAProxy,
  throughput-optimized off; ``fast-nouvloop``: ``fast`` with Ray's uvloop off (``RAY_USE_UVLOOP=0``). Each
  switch is measured on its own by comparing neighbours.
- ``floor``: one process, Starlette on uvicorn with the same verified session and codec, no Ray
  (``benchmarks/floor_server.py``): the cost of Python HTTP alone; ``floor-batch``: with a plain
  stacking batcher (max 8).
- ``bento``: a BentoML service (``benchmarks/bento_service.py`` in ``.venv-bento``, 1 worker, adaptive
  batching, max batch 8) with a plain ORT session of the profile's model and settings (JSON only).

Bodies (``--wire``): the Open Inference Protocol with binary tensors (tritonclient's default) and
with JSON tensors; each asks for one output (the encoder's last_hidden_state, MiniLM's
sentence_embedding). gRPC (``--grpc``): KServe v2 ModelInfer with raw contents at concurrency 1
on the ``fast`` server's gRPC port. All servers run at once (idle while another is measured) and
the cells are interleaved: every round measures each configuration at each concurrency, in an
order that rotates per round; the tables give medians over rounds. A bare in-process
``load_profile(...).run`` is timed every round (batch 1: the latency floor; batch 8: the
machine's batched ceiling in items/s). Cold start (command to ready) is measured for every
``ortpilot serve`` started. ``--codec`` times the OIP decode and encode of one request at 1x128
and at a 1x3x320x320 image, binary and JSON.

    flock -x /tmp/ortpilot-cpu.lock .venv-test/bin/python benchmarks/bench_serve.py [--rounds 3] [--seconds 4]
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import shutil
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
# ortpilot serve configurations: extra CLI arguments.
ORTPILOT_CONFIGS = {
    "fast": ["--replicas", "1"],
    "fast-batch": ["--replicas", "1", "--max-batch", "8", "--batch-wait-ms", "2"],
    "fast-2x1": ["--replicas", "2", "--cpus-per-replica", "1"],
    "proxy": ["--replicas", "1", "--ingress", "proxy", "--no-throughput-optimized"],
    "proxy-to": ["--replicas", "1", "--ingress", "proxy"],
    "haproxy-noto": ["--replicas", "1", "--no-throughput-optimized"],
    "fast-nouvloop": ["--replicas", "1"],
}
# ... and the environment a configuration adds (the local Ray instance inherits the server's).
ORTPILOT_ENV = {"fast-nouvloop": {"RAY_USE_UVLOOP": "0"}}
FLOOR_CONFIGS = {"floor": 1, "floor-batch": 8}
BENTO_CONFIG = "bento"
ALL_CONFIGS = [*ORTPILOT_CONFIGS, *FLOOR_CONFIGS, BENTO_CONFIG]
DEFAULT_CONFIGS = ["fast", "fast-batch", "fast-2x1", "floor", "floor-batch", BENTO_CONFIG]
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


def oip_request(feeds: dict[str, np.ndarray], output: str, binary: bool = True) -> tuple[bytes, dict[str, str]]:
    """An infer body with binary tensors, as tritonclient.http builds it, or with JSON tensors."""
    if not binary:
        doc = {
            "inputs": [
                {"name": k, "shape": list(v.shape), "datatype": "INT64", "data": v.reshape(-1).tolist()}
                for k, v in feeds.items()
            ],
            "outputs": [{"name": output}],
        }
        return json.dumps(doc).encode(), {"Content-Type": "application/json"}
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


def run_clients(make_client, concurrency: int, seconds: float) -> dict[str, float]:
    """``concurrency`` closed-loop clients for ``seconds`` after a short warmup; ``make_client()`` gives each
    thread its own ``request() -> ok`` (its own keep-alive connection or channel)."""
    latencies: list[float] = []
    errors = [0]
    lock = threading.Lock()
    start = time.perf_counter()
    warm, end = start + 0.5, start + 0.5 + seconds

    def client() -> None:
        request = make_client()
        mine = []
        while True:
            t0 = time.perf_counter()
            if t0 >= end:
                break
            ok = request()
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


def closed_loop(
    port: int, path: str, body: bytes, headers: dict[str, str], concurrency: int, seconds: float
) -> dict[str, float]:
    """HTTP clients, each with one keep-alive connection (``http.client``)."""

    def make_client():
        conn = [http.client.HTTPConnection("127.0.0.1", port, timeout=60)]

        def request() -> bool:
            try:
                conn[0].request("POST", path, body, headers)
                resp = conn[0].getresponse()
                resp.read()
                return resp.status == 200
            except (OSError, http.client.HTTPException):
                conn[0] = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
                return False

        return request

    return run_clients(make_client, concurrency, seconds)


WRK = shutil.which("wrk")
WRK_SCRIPT = """
wrk.method = "POST"
local f = io.open(os.getenv("BENCH_BODY"), "rb")
wrk.body = f:read("*all")
f:close()
for k, v in string.gmatch(os.getenv("BENCH_HEADERS"), "([^\\n:]+): ([^\\n]*)") do wrk.headers[k] = v end
function done(summary, latency, requests)
  io.write(string.format("RESULT %d %d %d %f %f %f\\n", summary.requests, summary.errors.status,
    summary.errors.connect + summary.errors.read + summary.errors.write + summary.errors.timeout,
    latency:percentile(50) / 1000, latency:percentile(99) / 1000, summary.duration / 1e6))
end
"""
_UNITS = {"us": 1e-3, "ms": 1.0, "s": 1000.0}


def wrk_closed_loop(
    port: int, path: str, body: bytes, headers: dict[str, str], concurrency: int, seconds: float
) -> dict[str, float]:
    """The same closed loop driven by wrk (C, one thread, event-driven): on 2 cores a Python client
    with 32 threads takes CPU the servers need; wrk takes a fraction of it."""
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        body_file, script = Path(tmp) / "body", Path(tmp) / "post.lua"
        body_file.write_bytes(body)
        script.write_text(WRK_SCRIPT)
        env = {
            **os.environ,
            "BENCH_BODY": str(body_file),
            "BENCH_HEADERS": "\n".join(f"{k}: {v}" for k, v in headers.items()),
        }
        out = subprocess.run(
            [
                WRK,
                "-t1",
                f"-c{concurrency}",
                f"-d{max(1, round(seconds))}s",
                "--timeout",
                "60s",
                "-s",
                str(script),
                f"http://127.0.0.1:{port}{path}",
            ],
            capture_output=True,
            text=True,
            env=env,
            timeout=seconds + 120,
        )
    line = next((ln for ln in out.stdout.splitlines() if ln.startswith("RESULT ")), None)
    if line is None:
        raise RuntimeError(f"wrk gave no result: {out.stdout}{out.stderr}")
    requests, bad_status, socket_errors, p50, p99, duration = line.split()[1:]
    ok = int(requests) - int(bad_status)
    return {
        "rps": ok / float(duration),
        "p50": float(p50),
        "p99": float(p99),
        "errors": int(bad_status) + int(socket_errors),
    }


def grpc_closed_loop(port: int, request: object, concurrency: int, seconds: float) -> dict[str, float]:
    """gRPC clients, one channel each: KServe v2 ModelInfer with raw contents."""
    import grpc
    from tritonclient.grpc import service_pb2_grpc

    def make_client():
        stub = service_pb2_grpc.GRPCInferenceServiceStub(grpc.insecure_channel(f"127.0.0.1:{port}"))

        def call() -> bool:
            try:
                stub.ModelInfer(request, timeout=60)
                return True
            except grpc.RpcError:
                return False

        return call

    return run_clients(make_client, concurrency, seconds)


def grpc_request(feeds: dict[str, np.ndarray], output: str) -> object:
    from tritonclient.grpc import service_pb2

    req = service_pb2.ModelInferRequest(model_name="m")
    for name, value in feeds.items():
        req.inputs.add(name=name, datatype="INT64", shape=value.shape)
        req.raw_input_contents.append(value.tobytes())
    req.outputs.add(name=output)
    return req


def bare(profile: Path, feeds: dict[str, np.ndarray], runs: int = 200) -> tuple[float, float]:
    """(p50 ms of one ``load_profile(...).run`` at batch 1, items/s at batch 8: the batched ceiling)."""
    import ortpilot

    sess = ortpilot.load_profile(profile)
    for _ in range(20):
        sess.run(None, feeds)
    times = []
    for _ in range(runs):
        t0 = time.perf_counter()
        sess.run(None, feeds)
        times.append(time.perf_counter() - t0)
    eight = {k: np.concatenate([v] * 8) for k, v in feeds.items()}
    for _ in range(5):
        sess.run(None, eight)
    batched = []
    for _ in range(max(10, runs // 8)):
        t0 = time.perf_counter()
        sess.run(None, eight)
        batched.append(time.perf_counter() - t0)
    return statistics.median(times) * 1000, 8 / statistics.median(batched)


def codec_costs(runs: int = 300) -> dict[str, dict[str, float]]:
    """Median µs to decode one infer request and encode its response, per body kind and tensor size."""
    from ortpilot.serve.oip.codec import decode_request, encode_response

    rng = np.random.default_rng(0)
    cases = {
        "1x128 (3 INT64 in, 1x128x384 FP32 out)": (
            {
                k: rng.integers(0, 1000, (1, 128), dtype=np.int64)
                for k in ("input_ids", "attention_mask", "token_type_ids")
            },
            {"last_hidden_state": rng.standard_normal((1, 128, 384), dtype=np.float32)},
        ),
        "1x3x320x320 image (FP32 in, 1x84x2100 FP32 out)": (
            {"images": rng.standard_normal((1, 3, 320, 320), dtype=np.float32)},
            {"output0": rng.standard_normal((1, 84, 2100), dtype=np.float32)},
        ),
    }
    out: dict[str, dict[str, float]] = {}
    for label, (feeds, outputs) in cases.items():
        for binary in (True, False):
            dtype = {np.dtype(np.int64): "INT64", np.dtype(np.float32): "FP32"}
            if binary:
                head = json.dumps(
                    {
                        "inputs": [
                            {
                                "name": k,
                                "shape": list(v.shape),
                                "datatype": dtype[v.dtype],
                                "parameters": {"binary_data_size": v.nbytes},
                            }
                            for k, v in feeds.items()
                        ]
                    }
                ).encode()
                body, length = head + b"".join(v.tobytes() for v in feeds.values()), len(head)
            else:
                body = json.dumps(
                    {
                        "inputs": [
                            {
                                "name": k,
                                "shape": list(v.shape),
                                "datatype": dtype[v.dtype],
                                "data": v.reshape(-1).tolist(),
                            }
                            for k, v in feeds.items()
                        ]
                    }
                ).encode()
                length = None
            dec, enc = [], []
            for _ in range(runs if binary else max(20, runs // 10)):
                t0 = time.perf_counter()
                decode_request(body, length)
                t1 = time.perf_counter()
                encode_response("m", outputs, binary)
                t2 = time.perf_counter()
                dec.append(t1 - t0)
                enc.append(t2 - t1)
            out[f"{label}, {'binary' if binary else 'JSON'}"] = {
                "body_bytes": len(body),
                "decode_us": statistics.median(dec) * 1e6,
                "encode_us": statistics.median(enc) * 1e6,
            }
    return out


def start_ortpilot(label: str, profile: Path, grpc: bool) -> Proc:
    port = free_port()
    argv = [
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
        *ORTPILOT_CONFIGS[label],
    ]
    if grpc:
        argv += ["--grpc-port", str(free_port())]
    started = time.perf_counter()
    proc = Proc(
        label, argv, port, {**ENV, **ORTPILOT_ENV.get(label, {})}, lambda p: _status(p, "/v2/health/ready") == 200
    )
    proc.cold_start_s = time.perf_counter() - started
    proc.grpc_port = int(argv[-1]) if grpc else None
    return proc


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=4.0)
    parser.add_argument("--models", nargs="*", default=list(MODELS))
    parser.add_argument("--configs", nargs="*", default=DEFAULT_CONFIGS, choices=ALL_CONFIGS)
    parser.add_argument("--wire", nargs="*", default=["binary", "json"], choices=["binary", "json"])
    parser.add_argument("--concurrency", nargs="*", type=int, default=list(CONCURRENCY))
    parser.add_argument("--grpc", action="store_true", help="also gRPC at concurrency 1 on the fast server")
    parser.add_argument("--codec", action="store_true", help="also time the OIP codec in-process")
    parser.add_argument(
        "--client",
        choices=["wrk", "python"],
        default="wrk" if WRK else "python",
        help="HTTP load generator: wrk (apt-get install wrk; the default where installed) or Python threads",
    )
    parser.add_argument("--json", dest="json_out", default=str(OUT / "bench_serve.json"))
    args = parser.parse_args()
    OUT.mkdir(parents=True, exist_ok=True)
    if BENTO_CONFIG in args.configs and not BENTO.is_file():
        sys.exit(f"BentoML is not installed at {BENTO}: see benchmarks/README.md (.venv-bento)")
    from ortpilot.graph.feeds import make_feeds
    from ortpilot.modelio import load_model

    results: dict[str, dict] = {"codec": codec_costs()} if args.codec else {}
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
            for label in args.configs:
                if label in ORTPILOT_CONFIGS:
                    servers[label] = start_ortpilot(label, profile, grpc=args.grpc and label == "fast")
                elif label in FLOOR_CONFIGS:
                    port = free_port()
                    servers[label] = Proc(
                        label,
                        [
                            sys.executable,
                            str(ROOT / "floor_server.py"),
                            str(profile),
                            str(port),
                            "--max-batch",
                            str(FLOOR_CONFIGS[label]),
                        ],
                        port,
                        ENV,
                        lambda p: _status(p, "/v2/health/ready") == 200,
                    )
                else:
                    port = free_port()
                    servers[label] = Proc(
                        label,
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
            requests: dict[str, tuple] = {}
            for label in args.configs:
                if label == BENTO_CONFIG:
                    requests[f"{label}|json"] = (label, "/infer", *bento_request(feeds))
                    continue
                for wire in args.wire:
                    requests[f"{label}|{wire}"] = (
                        label,
                        "/v2/models/m/infer",
                        *oip_request(feeds, output, wire == "binary"),
                    )
            grpc_req = grpc_request(feeds, output) if args.grpc and "fast" in servers else None
            for label, path, body, headers in requests.values():  # warm every server up, outside the clock
                closed_loop(servers[label].port, path, body, headers, 4, 1.0)
            if grpc_req is not None:
                grpc_closed_loop(servers["fast"].grpc_port, grpc_req, 2, 1.0)
            cells: dict[tuple[str, int], list[dict]] = {}
            bares: list[tuple[float, float]] = []
            keys = list(requests) + (["fast|grpc"] if grpc_req is not None else [])
            for r in range(args.rounds):
                bares.append(bare(profile, feeds))
                order = keys[r % len(keys) :] + keys[: r % len(keys)]
                for conc in args.concurrency:
                    for key in order:
                        if key == "fast|grpc":
                            if conc != 1:
                                continue
                            cell = grpc_closed_loop(servers["fast"].grpc_port, grpc_req, conc, args.seconds)
                        else:
                            label, path, body, headers = requests[key]
                            loop = wrk_closed_loop if args.client == "wrk" else closed_loop
                            cell = loop(servers[label].port, path, body, headers, conc, args.seconds)
                        cells.setdefault((key, conc), []).append(cell)
                        print(
                            f"[bench_serve] {name} round {r + 1} {key} c={conc}: {cell['rps']:.1f} req/s "
                            f"p50 {cell['p50']:.2f} ms p99 {cell['p99']:.2f} ms errors {cell['errors']}",
                            flush=True,
                        )
        finally:
            for server in servers.values():
                server.stop()
        results[name] = {
            "bare_p50_ms": statistics.median(b[0] for b in bares),
            "batched_ceiling_items_s": statistics.median(b[1] for b in bares),
            "profile_threads": doc["session_settings"]["intra_op_threads"],
            "cold_start_s": {k: round(v.cold_start_s, 2) for k, v in servers.items() if hasattr(v, "cold_start_s")},
            "cells": {
                f"{key}|{conc}": {k: statistics.median(c[k] for c in runs) for k in runs[0]}
                for (key, conc), runs in cells.items()
            },
        }
    Path(args.json_out).write_text(json.dumps(results, indent=2))
    print(f"load average after: {os.getloadavg()}; HTTP client: {args.client}")
    for name, res in results.items():
        if name == "codec":
            print(
                "\n### OIP codec, one request (median µs)\n\n| body | bytes | decode µs | encode µs |\n|---|---|---|---|"
            )
            for label, c in res.items():
                print(f"| {label} | {c['body_bytes']} | {c['decode_us']:.0f} | {c['encode_us']:.0f} |")
            continue
        print(
            f"\n### {name}: bare load_profile(...).run p50 {res['bare_p50_ms']:.2f} ms, batched ceiling "
            f"{res['batched_ceiling_items_s']:.0f} items/s (profile intra-op threads {res['profile_threads']}); "
            f"cold start {res['cold_start_s']}\n"
        )
        header = ["configuration|body"]
        for conc in args.concurrency:
            header += [f"c={conc} req/s", f"c={conc} p50 ms", f"c={conc} p99 ms"]
        print("| " + " | ".join(header) + " |")
        print("|" + "---|" * len(header))
        keys = sorted({k.rsplit("|", 1)[0] for k in res["cells"]}, key=lambda k: ALL_CONFIGS.index(k.split("|")[0]))
        for key in keys:
            row = [key]
            for conc in args.concurrency:
                cell = res["cells"].get(f"{key}|{conc}")
                row += [f"{cell['rps']:.1f}", f"{cell['p50']:.2f}", f"{cell['p99']:.2f}"] if cell else ["-"] * 3
            print("| " + " | ".join(row) + " |")


if __name__ == "__main__":
    main()
