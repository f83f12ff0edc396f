"""SIGTERM and SIGHUP end a command the way Ctrl-C does; a child never outlives the command.

Real signals to real processes: a running ``ortpilot tune`` (journal kept, worker gone, scratch
folder removed, exit 128 + the signal, one line saying what was kept), an ``--isolate``-d run
whose child hangs, a tune parent killed outright (its worker dies with it), and a signal that
arrives while a child is still being started (the race that used to orphan the child).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from corpus import CLI, Workspace, save, tiny_model
from leftovers import stray_entries

from ortpilot.childproc import child_process, spawn, stop
from ortpilot.session.isolate import CRASH_ENV
from ortpilot.tuning.worker import CRASH_ENV as TUNE_HOOK

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc, uses Linux signals")


def processes_mentioning(text: str) -> list[int]:
    """PIDs whose command line contains ``text`` (children's arguments hold paths under the test's $TMPDIR)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and int(entry.name) != os.getpid():
            try:
                cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode("utf-8", "replace")
                state = next((ln for ln in (entry / "status").read_text().splitlines() if ln.startswith("State:")), "")
            except OSError:
                continue
            if text in cmdline and "zombie" not in state:
                found.append(int(entry.name))
    return found


def wait_for(condition, timeout_s: float = 120.0, what: str = "") -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def start_tune(ws: Workspace, model: Path) -> subprocess.Popen[str]:
    """A tune whose first candidate after the baseline hangs in the worker (a ten-minute candidate)."""
    return subprocess.Popen(
        [*CLI, "tune", str(model), "-o", str(ws.out), "--budget", "600", "--no-quantize"],
        cwd=ws.cwd,
        env=ws.env({TUNE_HOOK: "hang:"}),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def wait_for_hanging_worker(ws: Workspace, proc: subprocess.Popen[str]) -> None:
    """The baseline is journaled (its last record, ``kept``, is on disk), so the worker is inside the hanging
    candidate."""
    wait_for(lambda: "kept" in _kinds(ws.out) or proc.poll() is not None, what="the baseline")
    assert proc.poll() is None, proc.communicate()[1][-3000:]
    assert processes_mentioning(str(ws.tmp)), "no worker was running"


def _kinds(out: Path) -> list[str]:
    path = out / "journal.jsonl"
    if not path.is_file():
        return []
    return [json.loads(ln).get("kind", "") for ln in path.read_text().splitlines() if ln.endswith("}")]


@pytest.mark.parametrize("sig,code", [(signal.SIGTERM, 143), (signal.SIGHUP, 129)])
def test_signal_to_a_running_tune_keeps_the_journal_and_stops_the_worker(
    sig: signal.Signals, code: int, demo_paths: dict[str, Path], tmp_path: Path
) -> None:
    ws = Workspace.create(tmp_path)
    proc = start_tune(ws, demo_paths["mlp"])
    try:
        wait_for_hanging_worker(ws, proc)
        proc.send_signal(sig)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == code, err[-3000:]
    assert "Traceback" not in err
    assert f"interrupted ({sig.name})" in err and "--resume" in err, err[-2000:]
    lines = [ln for ln in (ws.out / "journal.jsonl").read_text().splitlines() if ln]
    assert len(lines) >= 3 and all(json.loads(ln) for ln in lines)  # start, baseline prepared and timed
    assert not (ws.out / "profile.json").exists()
    assert not processes_mentioning(str(ws.tmp)), "the worker outlived the tune"
    assert not stray_entries(ws.tmp), f"scratch left behind: {stray_entries(ws.tmp)}"


def test_a_tune_killed_outright_takes_its_worker_with_it(demo_paths: dict[str, Path], tmp_path: Path) -> None:
    """SIGKILL runs no cleanup in the parent: the worker must die through the kernel (parent-death signal)."""
    ws = Workspace.create(tmp_path)
    proc = start_tune(ws, demo_paths["mlp"])
    try:
        wait_for_hanging_worker(ws, proc)
        proc.kill()  # the parent only, not its group: the worker is in its own session anyway
        proc.communicate(timeout=30)
        wait_for(lambda: not processes_mentioning(str(ws.tmp)), 30, "the worker to die with its parent")
    finally:
        if proc.poll() is None:
            proc.kill()


@pytest.mark.parametrize("sig,code", [(signal.SIGTERM, 143), (signal.SIGINT, 130)])
def test_signal_during_an_isolated_load_stops_the_hung_child(sig: signal.Signals, code: int, tmp_path: Path) -> None:
    ws = Workspace.create(tmp_path)
    model = save(tiny_model(), ws.inputs / "m.onnx")
    proc = subprocess.Popen(
        [*CLI, "run", str(model), "--isolate"],
        cwd=ws.cwd,
        env=ws.env({CRASH_ENV: "hang"}),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    wait_for(lambda: processes_mentioning(str(ws.tmp)), 60, "the isolated child")
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == code, err
    assert "Traceback" not in err and f"interrupted ({sig.name})" in err, err
    assert not processes_mentioning(str(ws.tmp)), "the hung child outlived its parent"
    assert not stray_entries(ws.tmp)


def test_an_interrupt_while_a_child_starts_is_raised_after_the_child_is_held(tmp_path: Path) -> None:
    """The old race: Ctrl-C inside Popen left the call before anyone held the child, which then ran on.

    Here the SIGINT is real and arrives at the worst moment (after the fork, before the caller has
    the process): it must surface as KeyboardInterrupt only once the child is held, so the block's
    cleanup kills it.
    """
    marker = str(tmp_path / "sleeper-marker")
    held: list[subprocess.Popen] = []

    def keep(proc: subprocess.Popen) -> None:
        held.append(proc)
        os.kill(os.getpid(), signal.SIGINT)  # delivered while the child is being started

    with pytest.raises(KeyboardInterrupt):
        try:
            spawn([sys.executable, "-c", "import time, sys; time.sleep(60)", marker], keep)
        finally:
            for proc in held:
                stop(proc)
    assert len(held) == 1 and held[0].returncode == -signal.SIGKILL
    assert not processes_mentioning(marker)


def test_child_process_block_kills_the_whole_group(tmp_path: Path) -> None:
    """A grandchild the child started is in the child's group and goes with it."""
    marker = str(tmp_path / "grandchild-marker")
    code = (
        f"import subprocess, sys, time; subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)', "
        f"{marker!r}]); time.sleep(60)"
    )
    with child_process([sys.executable, "-c", code, marker]):
        wait_for(lambda: len(processes_mentioning(marker)) == 2, 30, "child and grandchild")
    wait_for(lambda: not processes_mentioning(marker), 10, "the group to die")
