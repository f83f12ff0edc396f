"""The demo tune's wall time, old code against new, interleaved: does a change cost the README's first job?

Each run is the README's first job (``ortpilot tune``: the demo encoder, 60 s budget) in a fresh process with
its own emptied model cache (``ORTPILOT_CACHE_DIR``), timed from start to exit; the two codes alternate
(old, new, old, new, ...) so a slow stretch of the machine hits both. The old code comes from a source tree
on ``PYTHONPATH`` (a git worktree of the commit to compare with).

    git worktree add /tmp/wt-old <commit>
    .venv-test/bin/python benchmarks/bench_tune_wall.py --old /tmp/wt-old/src [--new src] [--pairs 5] [--json OUT]
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent


def one_tune(src: Path, budget: float) -> dict:
    with tempfile.TemporaryDirectory(prefix="tune-wall-") as tmp:
        env = {**os.environ, "ORTPILOT_CACHE_DIR": f"{tmp}/cache", "PYTHONPATH": str(src)}
        cmd = [sys.executable, "-c", "import sys; from ortpilot.cli.main import main; sys.exit(main())"]
        cmd += ["tune", "--budget", str(budget), "-o", f"{tmp}/out", "--json"]
        start = time.monotonic()
        out = subprocess.run(cmd, capture_output=True, text=True, env=env, check=False)
        wall = time.monotonic() - start
    if out.returncode != 0:
        raise RuntimeError(f"tune with {src} failed:\n{out.stderr[-2000:]}")
    doc = json.loads(out.stdout)
    won = "ORT default kept" if doc["default_best"] else f"{doc['winner']['label']}, {doc['speedup']['ratio']:.2f}x"
    return {"wall_s": wall, "outcome": won}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--old", required=True, help="the old code's source folder (put on PYTHONPATH)")
    ap.add_argument("--new", default=str(ROOT / "src"))
    ap.add_argument("--pairs", type=int, default=5)
    ap.add_argument("--budget", type=float, default=60)
    ap.add_argument("--json", default="")
    args = ap.parse_args()
    import onnxruntime as ort

    from ortpilot.providers.machineclass import this_class

    print(
        f"ONNX Runtime {ort.__version__}, {datetime.datetime.now().astimezone().isoformat(timespec='minutes')}, "
        f"machine class {this_class().name}, load average at start {os.getloadavg()[0]:.1f}",
        flush=True,
    )
    rows = []
    for pair in range(args.pairs):
        for name, src in (
            (("old", args.old), ("new", args.new)) if pair % 2 == 0 else (("new", args.new), ("old", args.old))
        ):
            row = {"pair": pair, "code": name, **one_tune(Path(src), args.budget)}
            rows.append(row)
            print(f"pair {pair} {name}: {row['wall_s']:.1f} s ({row['outcome']})", flush=True)
    old = [r["wall_s"] for r in rows if r["code"] == "old"]
    new = [r["wall_s"] for r in rows if r["code"] == "new"]
    ratios = [n / o for n, o in zip(new, old)]
    print(
        f"median wall: old {np.median(old):.1f} s, new {np.median(new):.1f} s; new/old pair by pair "
        f"{', '.join(f'{r:.2f}' for r in ratios)} (median {np.median(ratios):.2f})"
    )
    if args.json:
        Path(args.json).write_text(json.dumps({"rows": rows, "ratios": ratios}, indent=1))


if __name__ == "__main__":
    main()
