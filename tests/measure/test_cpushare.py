"""measure.cpushare: other processes' CPU time is told apart from this process tree's."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ortpilot.measure import cpushare

pytestmark = pytest.mark.skipif(not Path("/proc/stat").exists(), reason="reads /proc (Linux)")

SPIN = "import time\nend = time.monotonic() + 30\nwhile time.monotonic() < end: pass"
# spins until it has used 0.6 s of CPU, says so, and spins on (until killed, at most 60 s); the margin over
# the 0.5 s asserted below covers /proc's tick accounting, which lags the precise process clock
SPIN_REPORTING = (
    "import time\nwhile time.process_time() < 0.6: pass\nprint('spent', flush=True)\n"
    "end = time.monotonic() + 60\nwhile time.monotonic() < end: pass"
)


def _sampled_while(start_spinner) -> tuple[cpushare.CpuSample, cpushare.CpuSample]:
    """Samples 1.5 s apart while ``start_spinner`` keeps one CPU busy; the spinner is stopped after."""
    first = cpushare.sample()
    pid = start_spinner()
    try:
        time.sleep(1.5)
        last = cpushare.sample()
    finally:
        os.kill(pid, signal.SIGKILL)
    assert first is not None and last is not None
    return first, last


def test_a_child_of_this_process_is_not_other_work():
    """The tune's own worker is a live child: its CPU time is this tree's. The child says when it has
    used 0.6 s of CPU and spins on, so the bound holds however busy the machine is."""
    first = cpushare.sample()
    child = subprocess.Popen([sys.executable, "-c", SPIN_REPORTING], stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline().strip() == "spent"
        last = cpushare.sample()
    finally:
        child.kill()
        child.wait()
    assert first is not None and last is not None
    assert last.own_s - first.own_s >= 0.5
    others = (last.busy_s - first.busy_s) - (last.own_s - first.own_s)
    assert cpushare.others_share(first, last) == pytest.approx(
        min(1.0, max(0.0, others) / ((last.wall_s - first.wall_s) * last.cpus)), abs=0.01
    )


def test_a_process_outside_this_tree_is_counted():
    def start() -> int:
        # the shell exits at once: the spinner is re-parented, no longer a descendant of this process
        out = subprocess.run(
            ["sh", "-c", f'{sys.executable} -c "$0" >/dev/null 2>&1 & echo $!', SPIN],
            capture_output=True,
            text=True,
            check=True,
        )
        return int(out.stdout.strip())

    first, last = _sampled_while(start)
    assert last.own_s - first.own_s < 0.5  # this process slept
    assert cpushare.others_share(first, last) >= 0.8 / last.cpus  # one busy CPU of ``cpus``


def test_missing_or_equal_samples_claim_nothing():
    s = cpushare.sample()
    assert cpushare.others_share(None, s) is None
    assert cpushare.others_share(s, None) is None
    assert cpushare.others_share(s, s) is None
