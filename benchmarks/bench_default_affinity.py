"""Does ORT's default session's speed depend on which CPU the calling thread runs on? Time it there and away.

ORT's default session (no ``intra_op_num_threads``) pins a pool thread to each core beyond the first; the
thread that calls ``run`` is not pinned. This script loads a tuned folder's source model as a plain
``InferenceSession`` and the profile as a user does (``ortpilot.load_profile``), then, in one process,
alternates the calling thread between the CPUs that hold no pinned thread and the first one that does
(``ortpilot.measure.placement``), timing both sessions in 1 s blocks, and prints each placement's p50s and
the profile's speedup there.

    python benchmarks/bench_default_affinity.py OUTDIR [OUTDIR ...] [--seconds 1] [--repeat 3]
"""

from __future__ import annotations

import argparse
import datetime
import statistics
import time
from pathlib import Path
from typing import Any

from bench_outside_check import _sessions

from ortpilot.measure.placement import caller_on, pinned_cpus, placements
from ortpilot.tuning.reference import read_reference


def _p50_ms(run: Any, feeds: dict[str, Any], seconds: float) -> float:
    for _ in range(3):
        run(feeds)
    times = []
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        t0 = time.perf_counter()
        run(feeds)
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e3


def measure(outdir: Path, seconds: float, repeat: int) -> None:
    mine, plain, profile = _sessions(outdir, iobinding=False)
    feeds = read_reference(outdir / "reference.npz")[0]
    plain(feeds)
    places = placements()
    if not places:
        print(f"{outdir.name}: no choice of CPU (no pinned pool thread, or one CPU)")
        return
    found: dict[str, dict[str, list[float]]] = {}
    for _ in range(repeat):
        for label, cpus in zip(("away", "beside"), places, strict=True):
            with caller_on(cpus):
                got = found.setdefault(label, {"default": [], "profile": []})
                got["default"].append(_p50_ms(plain, feeds, seconds))
                got["profile"].append(_p50_ms(mine, feeds, seconds))
    cells = []
    for label, cpus in zip(("away", "beside"), places, strict=True):
        d, p = (statistics.median(found[label][k]) for k in ("default", "profile"))
        cells.append(
            f"caller on CPU {','.join(map(str, sorted(cpus)))} ({label}): default {d:.3f} ms, profile {p:.3f} ms, {d / p:.2f}x"
        )
    winner = profile.get("label") or (profile.get("candidate") or {}).get("label") or "profile"
    print(f"{outdir.name} ({winner}; pinned CPUs {sorted(pinned_cpus())}): " + "; ".join(cells), flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("outdirs", nargs="+", type=Path)
    ap.add_argument("--seconds", type=float, default=1.0)
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    import onnxruntime as ort

    from ortpilot.providers.machineclass import this_class

    print(
        f"ONNX Runtime {ort.__version__}, {datetime.datetime.now().astimezone().isoformat(timespec='minutes')}, "
        f"machine class {this_class().name}; blocks of {args.seconds:g} s, {args.repeat} per placement",
        flush=True,
    )
    for outdir in args.outdirs:
        measure(outdir, args.seconds, args.repeat)


if __name__ == "__main__":
    main()
