"""What a resume needs is kept in OUTDIR; a finished tune replays; killed writes' temp files are swept."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest
from click.testing import CliRunner

from ortpilot.artifacts.atomic import atomic_open, is_temp_name, sweep_temp_files
from ortpilot.cli.main import cli
from ortpilot.errors import UsageError
from ortpilot.tuning import tune
from ortpilot.tuning.journal import read_journal
from ortpilot.tuning.state import STATE_DIR


def _old(path: Path, age_s: float = 60.0) -> Path:
    """Backdate a file, as if its writer had died a minute ago."""
    then = time.time() - age_s
    os.utime(path, (then, then))
    return path


def test_temp_names_are_exactly_what_atomic_open_makes(tmp_path):
    with atomic_open(tmp_path / "model.onnx") as fh:
        made = [p.name for p in tmp_path.iterdir()]
        fh.write(b"x")
    assert len(made) == 1 and is_temp_name(made[0]), made
    for name in (
        "model.onnx",
        "notes.tmp",
        ".model.onnx.tmp",
        ".model.onnx.abc.tmp",
        ".model.onnx.ABCDEFGH.tmp",
        "model.onnx.abcdefgh.tmp",
        ".model.onnx.abcdefgh.tmp.bak",
    ):
        assert not is_temp_name(name), name


def test_sweep_removes_only_dead_temp_files_of_our_naming_in_that_folder(tmp_path):
    dead = tmp_path / ".model.onnx.ab_d1234.tmp"
    dead.write_bytes(b"half a model")
    _old(dead)
    young = tmp_path / ".profile.json.zzzzzzzz.tmp"  # its writer may be between mkstemp and its lock
    young.write_bytes(b"{")
    others = [tmp_path / n for n in ("notes.tmp", ".hidden.tmp", "model.onnx", ".model.onnx.abc.tmp")]
    nested = tmp_path / "sub" / ".model.onnx.abcdefgh.tmp"  # only the folder named is swept
    nested.parent.mkdir()
    for path in [*others, nested]:
        path.write_bytes(b"keep")
        _old(path)
    link = tmp_path / ".report.md.abcdefgh.tmp"  # a link is never followed or removed
    link.symlink_to(others[0])

    assert sweep_temp_files(tmp_path) == [dead]
    assert not dead.exists()
    assert all(p.exists() for p in [young, *others, nested, link])
    assert sweep_temp_files(tmp_path / "missing") == []


def test_sweep_leaves_the_temp_file_of_a_live_writer(tmp_path):
    with atomic_open(tmp_path / "profile.json") as fh:
        fh.write(b"{}")
        (live,) = [p for p in tmp_path.iterdir() if is_temp_name(p.name)]
        _old(live)
        assert sweep_temp_files(tmp_path, min_age_s=0) == []  # its writer holds the lock
    assert (tmp_path / "profile.json").read_bytes() == b"{}"
    assert not live.exists()


def test_sweep_removes_the_temp_file_of_a_writer_killed_mid_write(tmp_path):
    code = (
        "import sys, time\nfrom ortpilot.artifacts.atomic import atomic_open\n"
        "with atomic_open(sys.argv[1]) as fh:\n    fh.write(b'half'); fh.flush(); print('writing', flush=True)\n"
        "    time.sleep(600)\n"
    )
    proc = subprocess.Popen([sys.executable, "-c", code, str(tmp_path / "model.onnx")], stdout=subprocess.PIPE)
    try:
        assert proc.stdout.readline() == b"writing\n"
        (temp,) = [p for p in tmp_path.iterdir() if is_temp_name(p.name)]
        assert sweep_temp_files(tmp_path, min_age_s=0) == []  # alive: left alone
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    assert temp.exists() and not (tmp_path / "model.onnx").exists()
    assert sweep_temp_files(tmp_path, min_age_s=0) == [temp]
    assert list(tmp_path.iterdir()) == []


def test_out_dir_that_is_a_file_is_refused_before_any_work(tmp_path, demo_paths):
    taken = tmp_path / "taken.onnx"
    taken.write_bytes(b"not a folder")
    with pytest.raises(UsageError, match="taken.onnx' is a file, not a folder"):
        tune(str(demo_paths["mlp"]), taken, budget_s=10, quantize=False)
    assert taken.read_bytes() == b"not a folder"
    assert list(tmp_path.iterdir()) == [taken]


def _bench_keys(out: Path) -> list[tuple[str, str, str]]:
    return [
        (r["kind"], r.get("id", ""), r.get("stage", ""))
        for r in read_journal(out / "journal.jsonl")
        if r.get("kind") in ("prepared", "bench", "final", "rank")
    ]


def test_finished_tune_resumes_from_what_it_kept_and_refuses_kept_files_gone_or_damaged(tmp_path, demo_paths):
    out = tmp_path / "out"
    model = str(demo_paths["mlp"])
    first = tune(model, out, budget_s=8, quantize=False)
    state = out / STATE_DIR
    assert (state / "reference.npz").is_file() and (state / "heldout.npz").is_file()
    measured = _bench_keys(out)

    again = tune(model, out, budget_s=8, quantize=False, resume=True)  # the scratch folder of the first is gone
    assert again.resumed
    assert again.winner.candidate.id == first.winner.candidate.id
    assert again.speedup == first.speedup  # the same samples: replayed, not measured again
    assert _bench_keys(out) == measured
    assert not [k for k, n in Counter(measured).items() if n > 1]
    assert again.load_avg == first.load_avg  # a replay reports the load of the run that measured
    assert first.others_cpu is not None and again.others_cpu == first.others_cpu
    done = read_journal(out / "journal.jsonl")[-1]
    assert (done["kind"], done["winner"], done["files"]) == ("done", first.winner.candidate.id, again.files)

    journal = (out / "journal.jsonl").read_bytes()
    reference = (state / "reference.npz").read_bytes()
    (state / "reference.npz").write_bytes(reference[:-10])
    with pytest.raises(UsageError, match=r"reference\.npz.*damaged.*Drop --resume"):
        tune(model, out, budget_s=8, quantize=False, resume=True)
    (state / "reference.npz").write_bytes(reference)
    (state / "heldout.npz").unlink()
    result = CliRunner().invoke(cli, ["tune", model, "-o", str(out), "--budget", "8", "--no-quantize", "--resume"])
    assert result.exit_code == 2, result.output
    assert "heldout.npz" in result.output and "is missing" in result.output
    assert "Traceback" not in result.output
    assert (out / "journal.jsonl").read_bytes() == journal  # a refused resume writes nothing


def test_ctrl_c_then_resume_gates_the_rest_on_the_kept_reference(tmp_path, demo_paths):
    """Ctrl-C deletes the run's scratch folder (the outputs the journal's records name); the
    resumed run gates the candidates it still measures on the copy kept in OUTDIR."""
    out = tmp_path / "out"
    cmd = [
        sys.executable,
        "-m",
        "ortpilot.cli.main",
        "tune",
        str(demo_paths["mlp"]),
        "-o",
        str(out),
        "--budget",
        "30",
        "--no-quantize",
    ]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True)
    deadline = time.monotonic() + 60
    while len(read_journal(out / "journal.jsonl")) < 6:
        assert proc.poll() is None and time.monotonic() < deadline, "tune ended before it could be interrupted"
        time.sleep(0.05)
    os.killpg(proc.pid, signal.SIGINT)  # Ctrl-C: the whole foreground group, workers included
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err.decode()[-2000:]
    before = _bench_keys(out)
    assert not (out / "profile.json").exists()

    result = tune(str(demo_paths["mlp"]), out, budget_s=10, quantize=False, resume=True)
    after = _bench_keys(out)
    assert after[: len(before)] == before and len(after) > len(before)  # went on measuring
    assert not [k for k, n in Counter(after).items() if n > 1]
    gated = [e for e in result.entries if e.accuracy and e.candidate.id not in {k[1] for k in before}]
    assert gated and all(e.accuracy["passed"] for e in gated)  # fp32 knobs match the kept reference exactly
    assert (out / "profile.json").is_file()


def test_a_journal_from_before_the_session_knobs_field_resumes_as_the_tune_that_searched_them(tmp_path, demo_paths):
    out = tmp_path / "out"
    model = str(demo_paths["mlp"])
    first = tune(model, out, budget_s=8, quantize=False)
    journal = out / "journal.jsonl"
    lines = journal.read_text().splitlines()
    start = json.loads(lines[0])
    assert start["kind"] == "start" and start.pop("session_knobs") is True
    journal.write_text("\n".join([json.dumps(start), *lines[1:]]) + "\n")  # as ortpilot wrote it before the field

    again = tune(model, out, budget_s=8, quantize=False, resume=True)
    assert again.resumed and again.winner.candidate.id == first.winner.candidate.id
    with pytest.raises(UsageError, match="differs in: session_knobs"):
        tune(model, out, budget_s=8, quantize=False, session_knobs=False, resume=True)
