"""Two routes into one ``ortpilot serve``, interleaved: how much a route's hops cost text clients.

Starts ``ortpilot serve PROFILE_DIR --name minilm`` and drives ``bench_serve_text.py``'s closed-loop clients
(one real sentence per request, OpenAI's embeddings body) at concurrency 1 and 32, ``--rounds`` rounds of
``--seconds`` each, the routes' order alternating per round: by default ``/v1/embeddings`` (HAProxy reads the
body's model and hands the request to the model's replica; before that, the server-wide application relayed
it, a second hop) against ``/v2/models/minilm/v1/embeddings`` (the model's own route, one hop). Medians over
rounds and the same-round ratio of the first route to the second.

    flock -x /tmp/ortpilot-cpu.lock .venv-test/bin/python benchmarks/bench_serve_routes.py PROFILE_DIR SENTENCES \\
        [--paths /v1/embeddings /v2/models/minilm/v1/embeddings] [--rounds 4] [--seconds 10] [--json OUT]
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import sys
from pathlib import Path
from typing import Any

import bench_serve_text as text
import numpy as np


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("profile", type=Path)
    ap.add_argument("sentences", type=Path)
    ap.add_argument("--paths", nargs=2, default=["/v1/embeddings", "/v2/models/minilm/v1/embeddings"])
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    import onnxruntime

    from ortpilot.providers.machineclass import this_class

    sentences = [s for s in args.sentences.read_text(encoding="utf-8").splitlines() if s.strip()]
    port = text.free_port()
    cmd = [sys.executable, "-m", "ortpilot.cli.main", "serve", str(args.profile), "--name", "minilm"]
    first = text.Target("routes", [*cmd, "--port", str(port)], port, args.paths[0], "minilm", dict(os.environ))
    second = first.route(args.paths[1])
    cells: dict[str, list[dict[str, float]]] = {}
    try:
        first.wait_ready()
        for target in (first, second):
            text.closed_loop(target, sentences, 4, 2.0)  # warm both
        for r in range(args.rounds):
            for target in (first, second) if r % 2 == 0 else (second, first):
                for clients in (1, 32):
                    cell = text.closed_loop(target, sentences, clients, args.seconds)
                    cells.setdefault(f"{target.path} c{clients}", []).append(cell)
                    print(f"round {r} {target.path} c={clients}: {cell}", flush=True)
    finally:
        first.stop()
    result: dict[str, Any] = {
        "date": datetime.date.today().isoformat(),
        "cpu_class": this_class().name,
        "ort": onnxruntime.__version__,
        "paths": args.paths,
        "cells": cells,
        "summary": {},
    }
    for clients in (1, 32):
        a, b = cells[f"{args.paths[0]} c{clients}"], cells[f"{args.paths[1]} c{clients}"]
        result["summary"][f"c{clients}"] = {
            **{
                f"{p} {k}": float(np.median([c[k] for c in got]))
                for p, got in zip(args.paths, (a, b))
                for k in ("rps", "p50_ms")
            },
            "rps_ratio_median": float(np.median([x["rps"] / y["rps"] for x, y in zip(a, b)])),
        }
    print(json.dumps(result["summary"], indent=1))
    if args.json:
        args.json.write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
