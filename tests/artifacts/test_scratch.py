"""Scratch folders and temp files of killed processes are swept by the next run, live ones never."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from ortpilot.artifacts.atomic import atomic_write_bytes, is_temp_name
from ortpilot.artifacts.scratch import LOCK_NAME, scratch_dir, sweep_scratch_dirs

HOLD = (
    "import sys, time\nfrom ortpilot.artifacts.scratch import scratch_dir\n"
    "with scratch_dir('ortpilot-tune-') as d:\n    (d / 'candidate.onnx').write_bytes(b'x' * 1000)\n"
    "    print(d, flush=True)\n    time.sleep(600)\n"
)


@pytest.fixture
def tmpdir_root(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """$TMPDIR for this process and its children."""
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    return tmp_path


def _age(path: Path, seconds: float = 10) -> None:
    past = time.time() - seconds
    os.utime(path, (past, past))


def test_killed_owner_leaves_a_folder_the_next_one_sweeps(tmpdir_root: Path) -> None:
    proc = subprocess.Popen([sys.executable, "-c", HOLD], stdout=subprocess.PIPE, env=os.environ.copy())
    try:
        held = Path(proc.stdout.readline().decode().strip())
        _age(held / LOCK_NAME)
        assert held.parent == tmpdir_root and (held / "candidate.onnx").exists()
        assert sweep_scratch_dirs("ortpilot-tune-") == []  # its owner is alive
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    assert held.exists()  # SIGKILL: no cleanup ran
    foreign = tmpdir_root / "ortpilot-tune-not-ours"  # no lock file: made by something else
    foreign.mkdir()
    with scratch_dir("ortpilot-tune-") as mine:
        assert not held.exists() and foreign.exists()
        assert (mine / LOCK_NAME).exists()
        assert sweep_scratch_dirs("ortpilot-tune-", min_age_s=0) == []  # ours, alive
    assert not mine.exists()


def test_a_young_folder_is_left_alone(tmpdir_root: Path) -> None:
    orphan = tmpdir_root / "ortpilot-opt-abcd_123"
    orphan.mkdir()
    (orphan / LOCK_NAME).write_bytes(b"")
    assert sweep_scratch_dirs("ortpilot-opt-") == []  # could be a process between mkdtemp and its lock
    _age(orphan / LOCK_NAME)
    assert sweep_scratch_dirs("ortpilot-opt-") == [orphan] and not orphan.exists()


def test_folders_that_are_not_ours_are_left_alone_and_a_fifo_does_not_hang(tmpdir_root: Path) -> None:
    named_otherwise = tmpdir_root / "ortpilot-opt-my-notes"  # not a mkdtemp name
    fifo_lock = tmpdir_root / "ortpilot-opt-fifo_123"
    for folder in (named_otherwise, fifo_lock):
        folder.mkdir()
    (named_otherwise / LOCK_NAME).write_bytes(b"")
    _age(named_otherwise / LOCK_NAME)
    os.mkfifo(fifo_lock / LOCK_NAME)  # opening it for reading without O_NONBLOCK would block forever
    _age(fifo_lock / LOCK_NAME)
    assert sweep_scratch_dirs("ortpilot-opt-") == []
    assert named_otherwise.exists() and fifo_lock.exists()


def test_a_write_sweeps_what_a_killed_write_of_the_same_file_left(tmp_path: Path) -> None:
    dead = tmp_path / ".model.onnx.ab_d1234.tmp"
    other = tmp_path / ".report.md.ab_d1234.tmp"
    for path in (dead, other):
        path.write_bytes(b"half")
        _age(path)
    longer = tmp_path / ".model.onnx.data.ab_d1234.tmp"  # starts like model.onnx's, belongs to model.onnx.data
    longer.write_bytes(b"half")
    _age(longer)
    atomic_write_bytes(tmp_path / "model.onnx", b"whole")
    assert not dead.exists() and other.exists() and longer.exists()  # only the destination's own leftovers
    assert sorted(p.name for p in tmp_path.iterdir() if not is_temp_name(p.name)) == ["model.onnx"]
    atomic_write_bytes(tmp_path / "model.onnx.data", b"whole")
    assert not longer.exists() and other.exists()
