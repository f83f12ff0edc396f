"""The done-when of the foundation: strict exits 1 on CUDA here, warn records it, CPU strict is 100%."""

from __future__ import annotations

import json
import subprocess
import sys


def _ortpilot(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "ortpilot.cli.main", *args], capture_output=True, text=True, timeout=120
    )


def test_strict_cuda_exits_1_and_says_how_to_get_it(demo_paths):
    res = _ortpilot("run", str(demo_paths["encoder"]), "-p", "cuda", "-p", "cpu", "--policy", "strict")
    assert res.returncode == 1, res.stderr
    assert "CUDAExecutionProvider" in res.stderr and "not in this ORT build" in res.stderr
    assert "onnxruntime-gpu" in res.stderr
    assert "Traceback" not in res.stderr


def test_warn_exits_0_and_json_records_fallback(demo_paths):
    res = _ortpilot("run", str(demo_paths["encoder"]), "-p", "cuda", "-p", "cpu", "--policy", "warn", "--json")
    assert res.returncode == 0, res.stderr
    doc = json.loads(res.stdout)
    (fb,) = doc["session"]["fallbacks"]
    assert fb["layer"] == 1 and fb["requested"] == "CUDAExecutionProvider"
    assert doc["session"]["providers"] == ["CPUExecutionProvider"]
    assert {o["name"] for o in doc["outputs"]} == {"last_hidden_state"}


def test_cpu_strict_json_has_full_cpu_placement(demo_paths):
    res = _ortpilot("run", str(demo_paths["encoder"]), "-p", "cpu", "--policy", "strict", "--json")
    assert res.returncode == 0, res.stderr
    doc = json.loads(res.stdout)
    placement = doc["session"]["placement"]
    assert placement["providers"]["CPUExecutionProvider"]["share"] == 1.0
    assert doc["outputs"][0]["shape"][0] == 1
    assert "input_ids=1x128" in doc["generated_inputs"]


def test_human_output_shows_placement_table(demo_paths):
    res = _ortpilot("run", str(demo_paths["cnn"]), "-p", "cpu")
    assert res.returncode == 0, res.stderr
    assert "Placement" in res.stdout and "CPUExecutionProvider" in res.stdout


def test_unknown_flag_and_bad_shape_exit_2(demo_paths):
    assert _ortpilot("run", str(demo_paths["mlp"]), "--frobnicate").returncode == 2
    res = _ortpilot("run", str(demo_paths["cnn"]), "--shape", "image=1x3")
    assert res.returncode == 2 and "rank" in res.stderr
