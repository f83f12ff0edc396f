"""A crashing candidate, a killed tune resumed, a budget too small, inputs with no shape."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter

import onnx
import pytest
from onnx import TensorProto, helper

from ortpilot.errors import UsageError
from ortpilot.tuning import tune
from ortpilot.tuning.journal import read_journal
from ortpilot.tuning.worker import CRASH_ENV


def test_candidate_that_segfaults_its_process_is_recorded_and_tune_completes(tmp_path, demo_paths, monkeypatch):
    monkeypatch.setenv(CRASH_ENV, "level=basic")  # the first knob candidate kills its worker (SIGSEGV)
    result = tune(str(demo_paths["mlp"]), tmp_path / "out", budget_s=20, quantize=False)
    crashed = [e for e in result.entries if e.status == "crashed"]
    assert crashed, [(e.candidate.label, e.status, e.reason) for e in result.entries]
    assert all(e.prepared.get("signal") == signal.SIGSEGV for e in crashed)
    assert "SIGSEGV" in crashed[0].reason
    assert any(e.status == "ok" and not e.candidate.baseline for e in result.entries)
    assert (tmp_path / "out" / "profile.json").is_file()


def _keys(records):
    return [
        (r.get("kind"), r.get("id", ""), r.get("stage", "")) for r in records if r.get("kind") in ("prepared", "bench")
    ]


def test_killed_tune_resumes_without_remeasuring_finished_candidates(tmp_path, demo_paths, monkeypatch):
    out = tmp_path / "out"
    journal = out / "journal.jsonl"
    scratch_root = tmp_path / "tmp"  # $TMPDIR of both tunes: the killed one's scratch folder stays there
    scratch_root.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(scratch_root))
    cmd = [sys.executable, "-m", "ortpilot.cli.main", "tune", str(demo_paths["mlp"]), "-o", str(out), "--budget", "40"]
    proc = subprocess.Popen(
        cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env={**os.environ, "TMPDIR": str(scratch_root)}
    )
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if sum(1 for r in read_journal(journal) if r.get("kind") == "prepared") >= 5:
            break
        assert proc.poll() is None, "tune finished before it could be killed"
        time.sleep(0.1)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    before = _keys(read_journal(journal))
    assert len([k for k in before if k[0] == "prepared"]) >= 5
    assert not (out / "profile.json").exists()
    (left,) = scratch_root.glob("ortpilot-tune-*")  # SIGKILL: no cleanup ran
    time.sleep(1.1)  # the sweep leaves folders younger than a second (their owner may be starting)

    result = tune(str(demo_paths["mlp"]), out, budget_s=20, resume=True)
    assert not left.exists() and not list(scratch_root.glob("ortpilot-tune-*"))
    after = _keys(read_journal(journal))
    assert after[: len(before)] == before  # the old records are kept as they were
    duplicates = [k for k, n in Counter(after).items() if n > 1]
    assert not duplicates, duplicates  # nothing finished was measured again
    assert result.resumed
    assert (out / "profile.json").is_file()
    assert read_journal(journal)[-1]["kind"] == "done"


def test_budget_too_small_for_the_baseline_writes_nothing(tmp_path, demo_paths):
    with pytest.raises(UsageError, match="budget"):
        tune(str(demo_paths["mlp"]), tmp_path / "out", budget_s=0.05)
    assert not (tmp_path / "out").exists()


def test_a_budget_within_the_output_reserve_is_refused_saying_so(tmp_path, demo_paths):
    """--budget 5 used to search for no time and blame ORT's default; it is refused before anything runs."""
    from ortpilot.tuning.search import OUTPUT_RESERVE_S

    with pytest.raises(UsageError) as err:
        tune(str(demo_paths["mlp"]), tmp_path / "out", budget_s=OUTPUT_RESERVE_S)
    text = str(err.value)
    assert "leaves no time to search" in text and f"--budget {2 * OUTPUT_RESERVE_S:g} or more" in text
    assert "ORT's default" not in text and not (tmp_path / "out").exists()


def test_model_without_input_shapes_asks_for_them_by_name(tmp_path):
    x = helper.make_tensor_value_info("features", TensorProto.FLOAT, [None, 4])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [None, 4])
    model = helper.make_model(
        helper.make_graph([helper.make_node("Relu", ["features"], ["y"])], "g", [x], [y]),
        opset_imports=[helper.make_opsetid("", 18)],
        ir_version=10,
    )
    path = tmp_path / "m.onnx"
    onnx.save(model, path)
    with pytest.raises(UsageError, match="--shape features="):
        tune(str(path), tmp_path / "out", budget_s=10)
    assert not (tmp_path / "out").exists()


def test_a_tune_stopped_while_writing_into_an_earlier_tunes_folder_leaves_no_profile_of_the_other_model(
    tmp_path, demo_paths, tuned_mlp, monkeypatch
):
    """The profile is written last; the earlier tune's goes first, so the folder never pairs it with this model."""
    import shutil

    import ortpilot.tuning.report

    out = tmp_path / "out"
    shutil.copytree(tuned_mlp, out)
    before = (out / "model.onnx").read_bytes()

    def stopped(result):
        raise KeyboardInterrupt  # a Ctrl-C between model.onnx and profile.json

    monkeypatch.setattr(ortpilot.tuning.report, "write_reports", stopped)
    with pytest.raises(KeyboardInterrupt):
        tune(str(demo_paths["cnn"]), out, budget_s=10, quantize=False)
    assert (out / "model.onnx").read_bytes() != before  # this tune's model was written ...
    assert not (out / "profile.json").exists()  # ... and no profile says it is the MLP's
