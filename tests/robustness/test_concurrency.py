"""Processes sharing one cache directory at the same time all finish with the same, correct result.

The cache builds each entry under a per-entry file lock in a temp folder renamed into place;
these tests start several real ``ortpilot`` processes at once and check that exactly one of
them built the entry, every output is byte-identical, and the cache holds one sound entry
and no temp folders.
"""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

import pytest
from corpus import CLI, Workspace
from leftovers import (
    assert_cache_sound,
    assert_json_files_parse,
    cache_entries,
    stray_entries,
    temp_files,
)

import ortpilot


def start(ws: Workspace, command: str, *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [*CLI, command, *args], cwd=ws.cwd, env=ws.env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )


def finish(procs: list[subprocess.Popen[str]], timeout_s: float = 300) -> list[str]:
    outs = []
    for proc in procs:
        out, err = proc.communicate(timeout=timeout_s)
        assert proc.returncode == 0, err[-3000:]
        assert "Traceback" not in err, err[-3000:]
        outs.append(out)
    return outs


def optimize_together(ws: Workspace, model: Path, count: int) -> None:
    procs = [start(ws, "optimize", str(model), "-o", str(ws.out / f"opt{i}.onnx"), "--json") for i in range(count)]
    records = [json.loads(out)["record"] for out in finish(procs)]
    built = [r["extra"]["cache_hit"] for r in records].count(False)
    assert built <= 1, f"{built} processes built the same cache entry"
    outputs = {(ws.out / f"opt{i}.onnx").read_bytes() for i in range(count)}
    assert len(outputs) == 1, "concurrent optimize runs wrote different models"
    assert len(cache_entries(ws.cache)) == 1
    assert_cache_sound(ws.cache)
    cached = next(ws.cache.glob("models/*/model.onnx"))
    ortpilot.load(str(ws.out / "opt0.onnx"))  # the result is a loadable, stamp-valid model
    assert cached.stat().st_size > 0
    assert not stray_entries(ws.tmp) and not temp_files(ws.out) and not list(ws.cwd.iterdir())


def test_two_optimize_processes_share_one_cache(demo_paths: dict[str, Path], tmp_path: Path) -> None:
    optimize_together(Workspace.create(tmp_path), demo_paths["encoder"], 2)


def test_optimize_output_bytes_do_not_depend_on_the_clock(demo_paths: dict[str, Path], tmp_path: Path) -> None:
    """A cache miss, then a hit a second later, then a build without the cache: the same bytes."""
    ws = Workspace.create(tmp_path)
    first = ws.out / "first.onnx"
    finish([start(ws, "optimize", str(demo_paths["mlp"]), "-o", str(first))])
    time.sleep(1.1)
    finish([start(ws, "optimize", str(demo_paths["mlp"]), "-o", str(ws.out / "second.onnx"))])
    finish([start(ws, "optimize", str(demo_paths["mlp"]), "-o", str(ws.out / "third.onnx"), "--no-cache")])
    assert first.read_bytes() == (ws.out / "second.onnx").read_bytes() == (ws.out / "third.onnx").read_bytes()


@pytest.mark.parametrize("name", ["encoder", "cnn", "decoder"])
def test_many_optimize_processes_share_one_cache(name: str, demo_paths: dict[str, Path], tmp_path: Path) -> None:
    optimize_together(Workspace.create(tmp_path), demo_paths[name], 6)


def test_two_tune_processes_share_one_cache(demo_paths: dict[str, Path], tmp_path: Path) -> None:
    ws = Workspace.create(tmp_path)
    outs = [ws.out / "t1", ws.out / "t2"]
    procs = [start(ws, "tune", str(demo_paths["mlp"]), "-o", str(o), "--budget", "10", "--no-quantize") for o in outs]
    finish(procs)
    for out in outs:
        assert_json_files_parse(out)
        session = ortpilot.load_profile(str(out / "profile.json"))  # re-verifies the model hash and providers
        assert session.providers[0] == "CPUExecutionProvider"
        assert not temp_files(out)
    assert_cache_sound(ws.cache)
    assert not stray_entries(ws.tmp) and not list(ws.cwd.iterdir())
