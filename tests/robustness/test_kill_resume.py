"""SIGKILL a running ``ortpilot tune`` at random points; ``--resume`` must finish and nothing may be corrupt.

A kill point is a journal length drawn from the seed (0 = during start-up, before the journal
exists), so each seed stops the tune at a different step whatever the machine's speed. The
whole process group is killed, workers included, as a CI runner or the OOM killer would.
After the kill: every JSON file parses, the journal holds only complete records (a torn last
line at most), the profile is absent or complete. After ``--resume``: the same holds, the
journal's ``done`` record, the JSON result and profile.json name the same winner, the profile
loads, and no temp files remain in the output folder.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import time
from pathlib import Path

import pytest
from corpus import CLI, Workspace
from leftovers import (
    assert_cache_sound,
    assert_entry_sound,
    assert_json_files_parse,
    cache_entries,
    temp_files,
)

import ortpilot
from ortpilot.artifacts.profile import read_profile, verify_environment

TUNE_ARGS = ("--budget", "10", "--no-quantize")
JOURNAL = "journal.jsonl"


def journal_records(out: Path) -> list[dict]:
    """Complete records; only the very last line may be torn (no newline yet)."""
    path = out / JOURNAL
    if not path.is_file():
        return []
    raw = path.read_bytes()
    lines = raw.split(b"\n")
    complete, torn = lines[:-1], lines[-1]
    records = [json.loads(line) for line in complete]  # a complete line that does not parse is corruption
    if torn:
        assert not raw.endswith(b"\n")
    return records


def assert_not_corrupt(out: Path) -> None:
    if not out.exists():
        return
    journal_records(out)
    for path in out.rglob("*.json"):
        json.loads(path.read_text())
    if (out / "profile.json").exists():  # written last: if it is there, everything it names is complete
        verify_environment(read_profile(out / "profile.json"), out / "profile.json")


def kill_at(ws: Workspace, model: Path, out: Path, seed: int) -> bool:
    """Start a tune and SIGKILL its process group once the journal has k lines; False if it finished first."""
    rnd = random.Random(seed)
    target = rnd.randint(0, 20)  # a 10 s tune of the MLP journals about 23 records
    proc = subprocess.Popen(
        [*CLI, "tune", str(model), "-o", str(out), *TUNE_ARGS],
        cwd=ws.cwd,
        env=ws.env(),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    deadline = time.monotonic() + 120
    startup_delay = rnd.uniform(0.2, 1.5) if target == 0 else 0.0
    started = time.monotonic()
    while proc.poll() is None and time.monotonic() < deadline:
        if target == 0 and time.monotonic() - started >= startup_delay:
            break
        if target and len(journal_records(out)) >= target:
            break
        time.sleep(0.01)
    if proc.poll() is not None:
        return False
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    return True


def tune_json(ws: Workspace, model: Path, out: Path, *extra: str) -> dict:
    """Run a (short) tune to completion and return its JSON result."""
    proc = subprocess.run(
        [*CLI, "tune", str(model), "-o", str(out), *TUNE_ARGS, *extra, "--json"],
        cwd=ws.cwd,
        env=ws.env(),
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr
    return json.loads(proc.stdout)


def kill_then_resume(seed: int, model: Path, tmp_path: Path) -> None:
    ws = Workspace.create(tmp_path)
    out = ws.out / "tune"
    killed = kill_at(ws, model, out, seed)
    assert_not_corrupt(out)
    assert_cache_sound(ws.cache)
    if not killed:
        pytest.skip("the tune finished before its kill point")
    result = tune_json(ws, model, out, "--resume")
    winner = result["winner"]["id"]
    assert_not_corrupt(out)
    assert_json_files_parse(out)
    records = journal_records(out)
    steps = [(r.get("kind"), r.get("id"), r.get("stage")) for r in records if r.get("kind") in ("prepared", "bench")]
    assert len(steps) == len(set(steps)), "--resume measured a finished step again"
    done = [r for r in records if r.get("kind") == "done"]
    assert done and done[-1]["winner"] == winner
    profile = json.loads((out / "profile.json").read_text())
    assert profile["candidate"]["id"] == winner
    ortpilot.load_profile(str(out / "profile.json"))
    assert_cache_sound(ws.cache)
    assert not temp_files(out), f"temp files left in the output folder: {temp_files(out)}"


@pytest.mark.parametrize("seed", [1, 2])
def test_sigkill_then_resume(seed: int, demo_paths: dict[str, Path], tmp_path: Path) -> None:
    kill_then_resume(seed, demo_paths["mlp"], tmp_path)


@pytest.mark.slow
@pytest.mark.parametrize("seed", range(3, 13))
def test_sigkill_then_resume_many(seed: int, demo_paths: dict[str, Path], tmp_path: Path) -> None:
    kill_then_resume(seed, demo_paths["mlp"], tmp_path)


def test_resume_of_a_finished_tune_replays_the_same_winner(demo_paths: dict[str, Path], tmp_path: Path) -> None:
    ws = Workspace.create(tmp_path)
    out = ws.out / "tune"
    model = demo_paths["mlp"]
    winner = tune_json(ws, model, out)["winner"]["id"]
    measured = len(journal_records(out))
    again = tune_json(ws, model, out, "--resume")
    assert again["winner"]["id"] == winner
    assert len([r for r in journal_records(out) if r.get("kind") == "bench"]) == len(
        [r for r in journal_records(out)[:measured] if r.get("kind") == "bench"]
    ), "resume re-measured"


def kill_optimize_mid_build(ws: Workspace, model: Path) -> None:
    """SIGKILL ``optimize`` as soon as its cache build folder appears, then optimize again."""
    proc = subprocess.Popen(
        [*CLI, "optimize", str(model), "-o", str(ws.out / "opt.onnx")],
        cwd=ws.cwd,
        env=ws.env(),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    deadline = time.monotonic() + 120
    while proc.poll() is None and time.monotonic() < deadline and not list(ws.cache.glob("models/.build-*")):
        time.sleep(0.002)
    if proc.poll() is not None:
        pytest.skip("optimize finished before its build folder was seen")
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    assert not (ws.out / "opt.onnx").exists(), "a killed optimize left an output file"
    for key in cache_entries(ws.cache):  # an entry is either absent or complete
        assert_entry_sound(ws.cache, key)
    again = subprocess.run(
        [*CLI, "optimize", str(model), "-o", str(ws.out / "opt.onnx")],
        cwd=ws.cwd,
        env=ws.env(),
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert again.returncode == 0, again.stderr[-3000:]
    ortpilot.load(str(ws.out / "opt.onnx"))
    assert len(cache_entries(ws.cache)) == 1
    for key in cache_entries(ws.cache):
        assert_entry_sound(ws.cache, key)


def test_sigkill_optimize_mid_build_then_rerun(demo_paths: dict[str, Path], tmp_path: Path) -> None:
    kill_optimize_mid_build(Workspace.create(tmp_path), demo_paths["cnn"])


def test_killed_build_folder_is_swept_by_the_next_build(demo_paths: dict[str, Path], tmp_path: Path) -> None:
    ws = Workspace.create(tmp_path)
    kill_optimize_mid_build(ws, demo_paths["cnn"])
    assert_cache_sound(ws.cache)


def test_resume_sweeps_the_temp_file_of_a_killed_write(demo_paths: dict[str, Path], tmp_path: Path) -> None:
    ws = Workspace.create(tmp_path)
    out = ws.out / "tune"
    model = demo_paths["mlp"]
    proc = subprocess.Popen(
        [*CLI, "tune", str(model), "-o", str(out), *TUNE_ARGS],
        cwd=ws.cwd,
        env=ws.env(),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    deadline = time.monotonic() + 120
    while proc.poll() is None and time.monotonic() < deadline and not temp_files(out):
        time.sleep(0.001)
    if proc.poll() is not None:
        pytest.skip("the tune finished before a temp file was seen")
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    assert_not_corrupt(out)
    tune_json(ws, model, out, "--resume")
    assert_not_corrupt(out)
    assert not temp_files(out), f"temp files left in the output folder: {temp_files(out)}"
