"""serve.processes without Ray: a child seen and then gone (a zombie is not alive; a pid with another start time
is not the same process), the processes with an argument under a folder (not one beside it, and only those of
the names asked for), and ending them (SIGKILL for one that ignores SIGTERM)."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

from ortpilot.serve import processes

pytestmark = pytest.mark.skipif(not processes.PROC.is_dir(), reason="reads /proc (Linux)")

SLEEPER = (
    "import signal, sys, time\n"
    "if sys.argv[1] == 'stubborn':\n    signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
    "print('ready', flush=True)\n"
    "time.sleep(120)"
)


def _start(kind: str, *extra: str) -> subprocess.Popen:
    """A sleeping child, returned once its signal handler is set (it says so)."""
    proc = subprocess.Popen([sys.executable, "-c", SLEEPER, kind, *extra], stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
    return proc


def test_a_child_is_seen_alive_and_not_once_it_exited_even_unreaped():
    proc = _start("plain")
    try:
        found = processes.children()
        assert proc.pid in found and processes.alive(proc.pid) and processes.same(proc.pid, found[proc.pid])
        assert not processes.same(proc.pid, found[proc.pid] + 1)  # another process that got this pid
        assert processes.end({proc.pid: found[proc.pid] + 1}) == [] and processes.alive(proc.pid)  # not signalled
        proc.kill()
        while processes.alive(proc.pid):  # until the kernel has it as a zombie (reaped below)
            time.sleep(0.05)
        assert proc.pid not in processes.children() and not processes.same(proc.pid, found[proc.pid])
    finally:
        proc.kill()
        proc.wait()


def test_the_processes_under_a_folder_are_ended_and_others_are_left(tmp_path):
    folder = tmp_path / "op-run"
    (folder / "h").mkdir(parents=True)
    naming = [_start("plain", str(folder / "h" / "haproxy.cfg")), _start("stubborn", str(folder))]
    others = [_start("plain", f"{folder}-other/h.cfg"), _start("plain", f"-f{folder}/h.cfg")]  # beside it; glued
    try:
        assert sorted(processes.processes_using(folder)) == sorted(p.pid for p in naming)
        assert processes.processes_using(folder, names=("haproxy",)) == {}  # these are Python, not HAProxy
        assert sorted(processes.ending_processes_using(folder, wait_s=1.0)) == sorted(p.pid for p in naming)
        assert [p.wait(60) for p in naming] == [-15, -9]  # the stubborn one got SIGKILL after the wait
        assert all(processes.alive(p.pid) for p in others) and processes.processes_using(folder) == {}
    finally:
        for p in [*naming, *others]:
            p.kill()
            p.wait()
