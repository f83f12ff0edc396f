"""serve.processes without Ray: a child seen and then gone (a zombie is not alive), the processes whose
command line names a folder, and ending them (SIGKILL for one that ignores SIGTERM)."""

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
    "time.sleep(60)"
)


def _start(kind: str, *extra: str) -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, "-c", SLEEPER, kind, *extra])
    time.sleep(0.3)  # until its signal handler is set
    return proc


def test_a_child_is_seen_alive_and_not_once_it_exited_even_unreaped():
    proc = _start("plain")
    try:
        assert proc.pid in processes.children() and processes.alive(proc.pid)
        proc.kill()
        deadline = time.monotonic() + 10
        while processes.alive(proc.pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not processes.alive(proc.pid)  # a zombie until reaped below
        assert proc.pid not in processes.children()
    finally:
        proc.kill()
        proc.wait()
    assert not processes.alive(proc.pid)


def test_the_processes_naming_a_folder_are_ended_and_others_are_left(tmp_path):
    folder = tmp_path / "op-run"
    folder.mkdir()
    naming = [_start("plain", str(folder / "h" / "haproxy.cfg")), _start("stubborn", f"-f{folder}/h/x.cfg")]
    other = _start("plain", str(tmp_path / "elsewhere"))
    try:
        assert processes.processes_using(folder) == sorted(p.pid for p in naming)
        assert sorted(processes.ending_processes_using(folder, wait_s=1.0)) == sorted(p.pid for p in naming)
        assert [p.wait(10) for p in naming] == [-15, -9]  # the stubborn one got SIGKILL after the wait
        assert processes.alive(other.pid) and processes.processes_using(folder) == []
    finally:
        for p in [*naming, other]:
            p.kill()
            p.wait()
