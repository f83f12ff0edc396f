"""``ortpilot bench --baseline OLD.json --max-slowdown PCT``: a regression gate against a saved run."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import onnx
import pytest
from onnx import helper, numpy_helper

from ortpilot.artifacts.atomic import save_model
from ortpilot.modelio import load_model

CLI = [sys.executable, "-m", "ortpilot.cli.main", "bench"]


def _bench(*args: object) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*CLI, *map(str, args), "--no-roofline"], capture_output=True, text=True, timeout=300)


def slowed(model: onnx.ModelProto, work: int = 24) -> onnx.ModelProto:
    """The same model with a deliberate slowdown: a chain of ``work`` 256x256 MatMuls whose result is
    multiplied by zero and added to the output (ORT's optimizer at level 'disable' keeps all of it)."""
    out = onnx.ModelProto()
    out.CopyFrom(model)
    graph = out.graph
    y = graph.output[0].name
    rng = np.random.default_rng(0)
    graph.initializer.extend(
        [
            numpy_helper.from_array(rng.standard_normal((256, 256)).astype(np.float32) / 16, "slow_w"),
            numpy_helper.from_array(np.ones((1, 256), np.float32), "slow_x"),
            numpy_helper.from_array(np.zeros((), np.float32), "slow_zero"),
        ]
    )
    prev = "slow_x"
    for i in range(work):
        graph.node.append(helper.make_node("MatMul", [prev, "slow_w"], [f"slow_{i}"]))
        prev = f"slow_{i}"
    graph.node.extend(
        [
            helper.make_node("ReduceSum", [prev], ["slow_sum"], keepdims=0),
            helper.make_node("Mul", ["slow_sum", "slow_zero"], ["slow_nothing"]),
        ]
    )
    for node in graph.node:  # the output now also carries the chain's (zero) result
        node.output[:] = [o if o != y else "fast_y" for o in node.output]
    graph.node.append(helper.make_node("Add", ["fast_y", "slow_nothing"], [y]))
    return out


@pytest.fixture(scope="module")
def models(tmp_path_factory, demo_paths):
    folder = tmp_path_factory.mktemp("baseline")
    old, new = folder / "old.onnx", folder / "new.onnx"
    save_model(load_model(demo_paths["mlp"]), old)
    save_model(slowed(load_model(demo_paths["mlp"])), new)
    base = folder / "base.json"
    proc = _bench(old, "--level", "disable", "--duration", "2", "--json")
    assert proc.returncode == 0, proc.stderr
    base.write_text(proc.stdout)
    return {"old": old, "new": new, "base": base}


def test_a_deliberately_slowed_model_fails_the_gate_interleaved_with_the_old_one(models):
    proc = _bench(
        models["new"],
        "--level",
        "disable",
        "--vs",
        f"--model {models['old']}",
        "--duration",
        "3",
        "--baseline",
        models["base"],
        "--max-slowdown",
        "10",
        "--json",
    )
    assert proc.returncode == 1, proc.stderr
    doc = json.loads(proc.stdout)["regression"]
    assert doc["slower"] and doc["method"] == "interleaved" and doc["ci95"][0] > 1.1
    assert "Performance regression against --baseline: slower:" in proc.stderr


def test_the_same_model_passes_against_its_own_saved_run(models):
    proc = _bench(
        models["old"], "--level", "disable", "--duration", "2", "--baseline", models["base"], "--max-slowdown", "50"
    )
    assert proc.returncode == 0, proc.stderr
    assert "ok: p50" in proc.stdout and "saved run's" in proc.stdout


@pytest.mark.parametrize(
    "args,message",
    [
        (["{new}", "--level", "disable"], "measured another model"),
        (["{old}", "--level", "all"], "measured something else: settings"),
        (["{old}", "--level", "disable", "--max-slowdown", "0"], "--max-slowdown must be a positive"),
        (["{old}", "--level", "disable", "--max-slowdown", "ten"], "--max-slowdown must be a number"),
    ],
)
def test_a_baseline_of_something_else_or_a_bad_limit_is_exit_2(models, args, message):
    args = [a.format(**models) for a in args]
    if "--max-slowdown" not in args:
        args += ["--max-slowdown", "10"]
    proc = _bench(*args, "--duration", "1", "--baseline", models["base"])
    assert proc.returncode == 2 and message in proc.stderr and "Traceback" not in proc.stderr, proc.stderr


def test_baseline_and_max_slowdown_go_together_and_the_file_must_be_a_bench_result(models, tmp_path):
    assert "--max-slowdown needs --baseline" in _bench(models["old"], "--max-slowdown", "10").stderr
    assert "--baseline needs --max-slowdown" in _bench(models["old"], "--baseline", models["base"]).stderr
    junk = tmp_path / "junk.json"
    junk.write_text('{"kind": "tune"}')
    proc = _bench(models["old"], "--baseline", junk, "--max-slowdown", "10")
    assert proc.returncode == 2 and "is not an 'ortpilot bench --json' result" in proc.stderr
