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


def _follows_its_figures(proc: subprocess.CompletedProcess[str], method: str) -> dict:
    """The verdict a run printed, checked against the figures printed beside it: 'slower' exactly when the CI's
    lower end is above the limit, exit 1 exactly then (whatever this machine's speed made the figures)."""
    doc = json.loads(proc.stdout)["regression"]
    assert doc["method"] == method and doc["slower"] == (doc["ci95"][0] > doc["limit"])
    assert proc.returncode == (1 if doc["slower"] else 0), proc.stderr
    assert ("Performance regression against --baseline: slower:" in proc.stderr) == doc["slower"]
    assert doc["line"].startswith("slower: " if doc["slower"] else "ok: ") and doc["line"] in " ".join(
        proc.stderr.split()
    )
    return doc


def test_a_slowed_model_interleaved_with_the_old_one_is_judged_by_the_printed_ci(models):
    """The gate's wiring on real runs: new (the model plus a chain of MatMuls) against old in this process, its
    verdict from the interleaved CI; which verdict this machine gives is the benchmarks' business, the rule's
    outcome on given figures is tested below."""
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
    doc = _follows_its_figures(proc, "interleaved")
    assert doc["limit"] == pytest.approx(1.10)


def test_the_same_model_against_its_own_saved_run_is_judged_by_both_runs_cis(models):
    proc = _bench(
        models["old"],
        "--level",
        "disable",
        "--duration",
        "2",
        "--baseline",
        models["base"],
        "--max-slowdown",
        "50",
        "--json",
    )
    doc = _follows_its_figures(proc, "saved CI")
    saved = json.loads(models["base"].read_text())["latency"]
    assert doc["old_p50_ms"] == saved["p50_ms"] and doc["limit"] == pytest.approx(1.5)


def test_the_verdict_from_given_figures():
    """slower exactly when the CI's lower end exceeds 1 + PCT/100, by either method (RegressionVerdict)."""
    from ortpilot.measure.regression import from_interleaved, from_saved_ci

    def run(p50: float, low: float, high: float) -> dict:
        return {"latency": {"p50_ms": p50, "median_ci95_ms": [low, high]}}

    # interleaved: the paired ratio old / new = 0.4 (new 2.5x slower), CI 0.38-0.42
    slowed = from_interleaved(run(2.5, 2.4, 2.6), run(1.0, 0.9, 1.1), {"ratio": 0.4, "ci95": [0.38, 0.42]}, 10)
    assert slowed.slower and slowed.ci_low == pytest.approx(1 / 0.42) and slowed.line().startswith("slower: ")
    same = from_interleaved(run(1.0, 0.9, 1.1), run(1.0, 0.9, 1.1), {"ratio": 1.0, "ci95": [0.95, 1.06]}, 10)
    assert not same.slower and same.line().startswith("ok: ")
    # saved CI: new 1.2 ms [1.15, 1.25] against old 1.0 ms [0.98, 1.02]: the lower end 1.15 / 1.02 = 1.127
    assert from_saved_ci(run(1.2, 1.15, 1.25), run(1.0, 0.98, 1.02), 10).slower
    assert not from_saved_ci(run(1.2, 1.15, 1.25), run(1.0, 0.98, 1.02), 15).slower
    assert not from_saved_ci(run(1.0, 0.97, 1.03), run(1.0, 0.98, 1.02), 50).slower


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
