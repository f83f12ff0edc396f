"""ORT's default session pins its intra-op pool threads; ``placements`` finds the CPUs beside and away from them."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

PROBE = """
import json, os, sys
import numpy as np
import onnxruntime as ort
from ortpilot.measure.placement import caller_on, pinned_cpus, placements

options = ort.SessionOptions()
if sys.argv[2] == "explicit":
    options.intra_op_num_threads = len(os.sched_getaffinity(0))
sess = ort.InferenceSession(sys.argv[1], options, providers=["CPUExecutionProvider"])
sess.run(None, {"x": np.ones((1, 64), np.float32)})
# CI once read no pinned thread here right after run() (cause not found; 30 loaded runs here pinned at once):
# wait up to 5 s for one, and print every thread's CPUs so that a failure says what there was
import time
for _ in range(500 if sys.argv[2] == "default" else 0):
    if pinned_cpus():
        break
    time.sleep(0.01)
before = os.sched_getaffinity(0)
places = placements()
seen = []
for cpus in places:
    with caller_on(cpus):
        seen.append(sorted(os.sched_getaffinity(0)))
from pathlib import Path
from ortpilot.providers.cpubudget import allowed_cpus
threads = [sorted(allowed_cpus(t / "status")) for t in Path("/proc/self/task").iterdir()]
print(json.dumps({"pinned": sorted(pinned_cpus()), "places": [sorted(p) for p in places], "seen": seen,
                  "restored": os.sched_getaffinity(0) == before, "affinity": sorted(before), "threads": threads}))
"""


def _probe(model: str, threads: str) -> dict:
    out = subprocess.run([sys.executable, "-c", PROBE, model, threads], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr[-2000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="one CPU: ORT's default starts no pool thread to pin")
def test_the_default_session_pins_a_pool_thread_and_the_placements_are_beside_and_away_from_it(demo_paths):
    found = _probe(str(demo_paths["mlp"]), "default")
    pinned = set(found["pinned"])
    assert pinned, found  # ORT's default pins one pool thread per core beyond the first
    away, beside = (set(p) for p in found["places"])
    assert not away & pinned and beside <= pinned and len(beside) == 1, found
    assert found["seen"] == found["places"] and found["restored"], found


def test_a_session_with_explicit_threads_pins_nothing_and_leaves_no_choice(demo_paths):
    found = _probe(str(demo_paths["mlp"]), "explicit")
    assert found["pinned"] == [] and found["places"] == [] and found["restored"], found
