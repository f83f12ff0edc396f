"""What ``ortpilot.load(...).run`` costs over raw ``onnxruntime.InferenceSession.run``.

The tiny demo MLP runs in microseconds, so any per-call Python overhead shows. Three callers run
interleaved in one process, in alternating blocks (A B C, then C B A), each block timing
``--calls`` back-to-back calls, each between two clock reads, and keeping the block's median (a
neighbour's process pre-empting a few calls moves a mean, hardly a median):

  raw       onnxruntime.InferenceSession(...).run, a session created by hand with ORT defaults
  wrapped   ortpilot.load(...).run (VerifiedSession.run: one check of a flag, a try, then session.run)
  inner     the same VerifiedSession's own .session.run (same session as "wrapped", no wrapper)

``wrapped / inner`` is the wrapper's own cost (same ORT session); ``wrapped / raw`` is what a user
sees (also includes any difference in session options ortpilot sets). Ratios are medians of
per-round ratios with a bootstrap 95% CI (``measure.stats.paired_ratio_ci``). Target: <= 1.02.

    .venv/bin/python benchmarks/bench_wrapper_overhead.py [--blocks 300] [--calls 200] [--json]
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np
import onnxruntime as ort

import ortpilot
from ortpilot.graph.feeds import make_feeds
from ortpilot.measure.stats import paired_ratio_ci
from ortpilot.models import demo_model_path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--blocks", type=int, default=300, help="Rounds of alternating blocks.")
    parser.add_argument("--calls", type=int, default=200, help="Calls per block.")
    parser.add_argument("--model", default="mlp", help="Demo model name.")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()

    path = str(demo_model_path(args.model))
    verified = ortpilot.load(path, ["cpu"])
    raw = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    feeds = make_feeds(verified.model)
    callers = {
        "raw": lambda: raw.run(None, feeds),
        "wrapped": lambda: verified.run(None, feeds),
        "inner": lambda: verified.session.run(None, feeds),
    }
    for call in callers.values():  # warm-up; also lets VerifiedSession validate its first feed
        for _ in range(args.calls):
            call()

    per_call: dict[str, list[float]] = {name: [] for name in callers}
    names = list(callers)
    clock = time.perf_counter_ns
    for block in range(args.blocks):
        for name in names if block % 2 == 0 else names[::-1]:
            call, times = callers[name], [0] * args.calls
            for i in range(args.calls):
                t0 = clock()
                call()
                times[i] = clock() - t0
            per_call[name].append(float(np.median(times)) / 1e9)

    rounds = np.arange(args.blocks)
    doc = {
        "model": args.model,
        "blocks": args.blocks,
        "calls_per_block": args.calls,
        "onnxruntime": ort.__version__,
        "median_us": {k: float(np.median(v) * 1e6) for k, v in per_call.items()},
        "ratios": {},
    }
    for num, den in (("wrapped", "inner"), ("wrapped", "raw"), ("inner", "raw")):
        ratio, lo, hi = paired_ratio_ci(per_call[den], per_call[num], rounds, rounds)
        doc["ratios"][f"{num}/{den}"] = {"ratio": ratio, "ci95": [lo, hi]}
    if args.json:
        print(json.dumps(doc, indent=2))
        return
    print(f"model {args.model}, ORT {ort.__version__}, {args.blocks} blocks x {args.calls} calls, interleaved")
    for name, us in doc["median_us"].items():
        print(f"  {name:8s} median per call {us:8.2f} us")
    for key, r in doc["ratios"].items():
        print(f"  {key:14s} {r['ratio']:.4f}  (95% CI {r['ci95'][0]:.4f}-{r['ci95'][1]:.4f})")


if __name__ == "__main__":
    main()
