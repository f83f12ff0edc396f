"""Does a tuned profile's speedup depend on the machine's state? Time it against ORT's default for a while.

On this project's shared 2-core VMs, ORT's default session on one model runs at one of two speeds for
seconds at a time (the demo encoder: ~0.45 ms or ~0.73 ms p50), with /proc/stat showing no other load
and no steal: a neighbour on the host's cores, invisible from inside. Some winners gain more in the slow
state than in the fast one, so a tune taken in one state and a check taken in the other disagree.

This script alternates short blocks (default, profile, default) in one process for ``--seconds``, as a
user would load them (``ortpilot.load_profile`` against a plain ``InferenceSession``), splits the pairs
by the default's p50 into the slow and the fast state (the midpoint of its 10th and 90th percentiles,
when they are over 20 % apart), and prints each state's default p50, profile p50 and speedup.

    python benchmarks/bench_machine_state.py OUTDIR [OUTDIR ...] --seconds 90
"""

from __future__ import annotations

import argparse
import datetime
import json
import statistics
import time
from pathlib import Path
from typing import Any

from bench_outside_check import _sessions

BLOCK_S = 0.25  # one block's timing: short next to the states' seconds, long next to one run


def _block(run: Any, feeds: dict[str, Any], seconds: float = BLOCK_S) -> float:
    """p50 (ms) of back-to-back runs for ``seconds``."""
    times = []
    start = time.monotonic()
    while time.monotonic() - start < seconds:
        t0 = time.perf_counter()
        run(feeds)
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e3


def pairs_over(outdir: Path, seconds: float) -> list[tuple[float, float]]:
    """(default p50, profile p50) per block triple, in ms, for ``seconds``."""
    from ortpilot.tuning.reference import REFERENCE_FILE, read_reference, reference_feeds

    run_mine, run_plain, profile = _sessions(outdir, iobinding=False)
    ref = outdir / (profile["reference_outputs"].get("file") or REFERENCE_FILE)
    feeds = read_reference(ref)[0] if ref.is_file() else reference_feeds(profile)
    _block(run_plain, feeds, 1.0)
    _block(run_mine, feeds, 1.0)
    pairs = []
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        before, mine, after = _block(run_plain, feeds), _block(run_mine, feeds), _block(run_plain, feeds)
        pairs.append(((before + after) / 2, mine))
    return pairs


def by_state(pairs: list[tuple[float, float]]) -> dict[str, dict[str, float]]:
    """The pairs split at the midpoint of the default's 10th and 90th percentiles (one state when those
    are within 20 % of each other: ``one``): per state, the count, both p50s and the median speedup."""
    defaults = sorted(d for d, _ in pairs)
    low, high = defaults[len(defaults) // 10], defaults[(len(defaults) * 9) // 10]
    if high > 1.2 * low:
        split = (low + high) / 2
        states = {"fast": [p for p in pairs if p[0] < split], "slow": [p for p in pairs if p[0] >= split]}
    else:
        states = {"one": pairs}
    return {
        name: {
            "pairs": len(group),
            "default_p50_ms": statistics.median(d for d, _ in group),
            "profile_p50_ms": statistics.median(m for _, m in group),
            "speedup": statistics.median(d / m for d, m in group),
        }
        for name, group in states.items()
        if group
    }


def main() -> None:
    import onnxruntime as ort

    from ortpilot.providers.machineclass import this_class

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("outdirs", nargs="+", type=Path)
    ap.add_argument("--seconds", type=float, default=90.0)
    ap.add_argument("--json", default="")
    args = ap.parse_args()
    head = (
        f"ONNX Runtime {ort.__version__}, {datetime.datetime.now().astimezone().isoformat(timespec='minutes')}, "
        f"machine class {this_class().name}; {args.seconds:.0f} s of default/profile/default blocks of {BLOCK_S} s"
    )
    print(head, flush=True)
    rows = []
    for outdir in args.outdirs:
        profile = json.loads((outdir / "profile.json").read_text())
        states = by_state(pairs_over(outdir, args.seconds))
        rows.append({"outdir": str(outdir), "winner": profile["candidate"]["label"], "states": states})
        print(
            f"{outdir.name} ({profile['candidate']['label']}, headline "
            f"{profile['latency']['speedup_vs_default']['ratio']:.2f}x with the default at "
            f"{profile['latency']['baseline']['p50_ms']:.3f} ms): "
            + "; ".join(
                f"{name} state {s['pairs']} pairs, default {s['default_p50_ms']:.3f} ms, profile "
                f"{s['profile_p50_ms']:.3f} ms, {s['speedup']:.2f}x"
                for name, s in states.items()
            ),
            flush=True,
        )
    if args.json:
        Path(args.json).write_text(json.dumps({"header": head, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
