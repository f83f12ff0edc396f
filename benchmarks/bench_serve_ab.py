"""Serve's per-request cost, old code against new: one ``ortpilot serve`` of the same profile from each source
tree, both running, one closed-loop client at a time (concurrency 1), rounds alternating between them.

The profile is the demo MLP tuned once (its run takes microseconds: what is timed is the server around it).
Each server is ``ortpilot serve PROFILE --port P`` started with ``PYTHONPATH`` on its tree; the client sends
the Open Inference Protocol with binary tensors (tritonclient's default) and reads the output.

    git worktree add /tmp/wt-old <commit>
    .venv-test/bin/python benchmarks/bench_serve_ab.py --old /tmp/wt-old/src [--new src] [--rounds 6] [--seconds 5]
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start(src: Path, profile: Path, port: int, log: Path) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(src)}
    cmd = [sys.executable, "-c", "import sys; from ortpilot.cli.main import main; sys.exit(main())"]
    cmd += ["serve", str(profile), "--name", "m", "--port", str(port), "--host", "127.0.0.1"]
    return subprocess.Popen(cmd, env=env, stdout=log.open("w"), stderr=subprocess.STDOUT, start_new_session=True)


def wait_ready(port: int, proc: subprocess.Popen, timeout_s: float = 240) -> None:
    import urllib.request

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"server on port {port} exited with {proc.returncode}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/v2/models/m/ready", timeout=2) as r:
                if r.status == 200:
                    return
        except OSError:
            time.sleep(1)
    raise RuntimeError(f"server on port {port} not ready in {timeout_s} s")


def closed_loop(port: int, seconds: float) -> list[float]:
    import tritonclient.http as http

    client = http.InferenceServerClient(f"127.0.0.1:{port}")
    x = http.InferInput("x", [1, 64], "FP32")
    x.set_data_from_numpy(np.random.default_rng(0).standard_normal((1, 64)).astype(np.float32), binary_data=True)
    out = [http.InferRequestedOutput("y", binary_data=True)]
    for _ in range(20):
        client.infer("m", [x], outputs=out)
    times = []
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        t0 = time.perf_counter()
        client.infer("m", [x], outputs=out).as_numpy("y")
        times.append(time.perf_counter() - t0)
    client.close()
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--old", required=True, type=Path)
    parser.add_argument("--new", default=ROOT / "src", type=Path)
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="serve-ab-"))
    tune = [sys.executable, "-c", "import sys; from ortpilot.cli.main import main; sys.exit(main())"]
    tune += ["tune", "demo:mlp", "-o", str(work / "out"), "--budget", "15", "--no-quantize"]
    subprocess.run(tune, check=True, env={**os.environ, "PYTHONPATH": str(args.new)}, capture_output=True)
    profile = work / "out" / "profile.json"
    servers = {}
    try:
        for name, src in (("old", args.old), ("new", args.new)):
            port = free_port()
            servers[name] = (start(src, profile, port, work / f"{name}.log"), port)
        for proc, port in servers.values():
            wait_ready(port, proc)
        p50: dict[str, list[float]] = {"old": [], "new": []}
        for r in range(args.rounds):
            for name in ("old", "new") if r % 2 == 0 else ("new", "old"):
                times = closed_loop(servers[name][1], args.seconds)
                p50[name].append(float(np.median(times)) * 1e3)
        ratios = [n / o for n, o in zip(p50["new"], p50["old"])]
        doc = {
            "date": datetime.date.today().isoformat(),
            "old": str(args.old),
            "new": str(args.new),
            "p50_ms": {k: float(np.median(v)) for k, v in p50.items()},
            "p50_ms_rounds": p50,
            "new_over_old_median": float(np.median(ratios)),
            "new_over_old_range": [float(min(ratios)), float(max(ratios))],
            "load_avg": os.getloadavg()[0],
        }
        print(json.dumps(doc, indent=2))
        if args.json:
            Path(args.json).write_text(json.dumps(doc, indent=2))
    finally:
        for proc, _ in servers.values():
            with_signal(proc)


def with_signal(proc: subprocess.Popen) -> None:
    """Stop a server by its PID (SIGINT drains and stops what it started), its process group if it lingers."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)


if __name__ == "__main__":
    main()
