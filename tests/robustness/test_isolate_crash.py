"""Process isolation: a model that kills or hangs ORT takes down only the child, never the caller.

ORT 1.32 survived every malformed model tried (sparse/external-data offsets, recursive
functions, bad constant folding, ...), so the crash path is proven with a fault triggered on
purpose in the child (ORTPILOT_TEST_CRASH_IN_CHILD, read only by the child entry point), and
the hang path with a real model: Einsum '......->' makes onnx's shape inference loop forever.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pytest
from corpus import CLI, Workspace, cycle, einsum_hang, save, tiny_model
from leftovers import stray_entries

import ortpilot
from ortpilot.errors import ModelLoadError, OrtCrashError
from ortpilot.session.isolate import CRASH_ENV, TIMEOUT_ENV, describe_exit


@pytest.fixture
def own_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    folder = tmp_path / "tmp"
    folder.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(folder))
    monkeypatch.setenv("TMPDIR", str(folder))
    return folder


@pytest.mark.parametrize("fault,number", [("SIGSEGV", 11), ("SIGABRT", 6), ("SIGKILL", 9)])
def test_deliberate_signal_in_child_raises_crash_error(
    fault: str, number: int, tmp_path: Path, own_tmp: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    model = save(tiny_model(), tmp_path / "m.onnx")
    monkeypatch.setenv(CRASH_ENV, fault)
    with pytest.raises(OrtCrashError) as err:
        ortpilot.load(str(model), isolate=True)
    assert err.value.exit_code == 1
    assert f"ORT crashed while loading this model (signal {number}: {fault})" in str(err.value)
    assert "ortpilot inspect" in str(err.value)
    assert not stray_entries(own_tmp)


def test_deliberate_sigsegv_in_child_with_bytes_source(own_tmp: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(CRASH_ENV, "SIGSEGV")
    with pytest.raises(OrtCrashError, match="SIGSEGV"):
        ortpilot.load(tiny_model().SerializeToString(), isolate=True)
    assert not stray_entries(own_tmp), "the temp copy of the model bytes was left behind"


def test_hang_in_child_is_stopped_and_reported(tmp_path: Path, own_tmp: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A deliberate hang in the child (the one real ORT hang known, a malformed Einsum, is now refused
    before any session is created: see the next test)."""
    model = save(tiny_model(), tmp_path / "tiny.onnx")
    monkeypatch.setenv(CRASH_ENV, "hang")
    monkeypatch.setenv(TIMEOUT_ENV, "3")
    with pytest.raises(OrtCrashError) as err:
        ortpilot.load(str(model), isolate=True)
    assert "did not finish loading this model within 3 s" in str(err.value)
    assert TIMEOUT_ENV in str(err.value)
    assert not stray_entries(own_tmp), "a killed child's temp files were left behind"


def test_load_refuses_the_einsum_that_hangs_ort_without_isolation(tmp_path: Path) -> None:
    """This equation makes ORT 1.32's session creation loop forever; load names it at once instead."""
    from ortpilot.errors import ModelLoadError

    model = save(einsum_hang(), tmp_path / "hang.onnx")
    with pytest.raises(ModelLoadError, match=r"malformed Einsum equation.*\.\.\.\.\.\.->"):
        ortpilot.load(str(model))


def test_child_error_falls_through_to_the_in_process_message(tmp_path: Path, own_tmp: Path) -> None:
    model = save(cycle(), tmp_path / "cycle.onnx")
    with pytest.raises(ModelLoadError) as plain:
        ortpilot.load(str(model))
    with pytest.raises(ModelLoadError) as isolated:
        ortpilot.load(str(model), isolate=True)
    assert str(isolated.value) == str(plain.value)


def test_isolated_load_runs_like_a_plain_one(tmp_path: Path, own_tmp: Path) -> None:
    model = save(tiny_model(), tmp_path / "m.onnx")
    feeds = {"x": np.arange(8, dtype=np.float32).reshape(2, 4)}
    expected = ortpilot.load(str(model)).run(None, feeds)
    got = ortpilot.load(str(model), isolate=True).run(None, feeds)
    np.testing.assert_array_equal(got[0], expected[0])
    assert not stray_entries(own_tmp)


def test_describe_exit() -> None:
    assert describe_exit(-11) == "signal 11: SIGSEGV"
    assert describe_exit(3) == "exit status 3"


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_ctrl_c_during_an_isolated_load_stops_the_child(tmp_path: Path) -> None:
    """The child runs in its own session (a terminal's SIGINT misses it): the parent must kill it."""
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
    deadline = time.monotonic() + 60
    while not _processes_mentioning(str(ws.tmp)) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _processes_mentioning(str(ws.tmp)), "the isolated child never started"
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == 130, err
    assert "Traceback" not in err
    assert not _processes_mentioning(str(ws.tmp)), "the hung child outlived its parent"
    assert not stray_entries(ws.tmp)


def _processes_mentioning(text: str) -> list[int]:
    """Processes whose command line contains ``text`` (the isolated child's spec path holds its $TMPDIR)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if text in (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode("utf-8", "replace"):
                    found.append(int(entry.name))
            except OSError:
                continue
    return found
