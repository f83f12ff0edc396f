"""``ortpilot bench``: the JSON document, --vs interleaving, exit codes for bad input and failures."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from bench_models import failing_call, flaky_model
from click.testing import CliRunner

from ortpilot.cli.main import cli

STATS = (
    "min_ms",
    "mean_ms",
    "p50_ms",
    "p90_ms",
    "p95_ms",
    "p99_ms",
    "p999_ms",
    "max_ms",
    "std_ms",
    "median_ci95_ms",
    "inferences_per_s",
    "items_per_s",
    "noisy",
)


def _bench(*args: str):
    return CliRunner().invoke(cli, ["bench", *args], catch_exceptions=False)


def test_json_has_every_statistic_and_nothing_else_on_stdout() -> None:
    res = subprocess.run(
        [sys.executable, "-m", "ortpilot.cli.main", "bench", "demo:encoder", "--json", "--runs", "30"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert res.returncode == 0, res.stderr
    doc = json.loads(res.stdout)  # exactly one JSON document
    assert doc["kind"] == "bench" and doc["runs"] == 30
    assert all(k in doc["latency"] for k in STATS)
    assert doc["session_create_ms"] > 0 and doc["first_run_ms"] > 0 and doc["warmup"]["mode"] == "auto"
    assert doc["memory"]["peak_mb"] > 0 and "growth_mb" in doc["memory"]
    roof = doc["roofline"]
    assert roof["model_gflop"] > 0 and roof["peak_gflops"] > 0
    assert roof["fraction"] == pytest.approx(roof["achieved_gflops"] / roof["peak_gflops"])
    assert doc["shapes"]["input_ids"] == [1, 128] and doc["batch_size"] == 1


def test_vs_runs_interleaved_with_overrides(tmp_path) -> None:
    report = tmp_path / "r.html"
    res = _bench(
        "demo:mlp",
        "--runs",
        "20",
        "--warmup",
        "2",
        "--threads",
        "2",
        "--no-roofline",
        "--json",
        "--vs",
        "--threads 1 --name single",
        "--vs",
        "--iobinding",
        "--report",
        str(report),
    )
    assert res.exit_code == 0, res.output
    doc = json.loads(res.stdout)
    assert doc["kind"] == "comparison" and doc["baseline"] == "A"
    names = [c["name"] for c in doc["configs"]]
    assert names == ["A", "single", "C"]
    threads = [c["settings"]["intra_op_threads"] for c in doc["configs"]]
    assert threads == [2, 1, 2]  # flags not given in --vs keep the base values
    assert [c["iobinding"] for c in doc["configs"]] == [False, False, True]
    assert all(c["runs"] == 20 for c in doc["configs"]) and len(doc["ratios"]) == 2
    assert report.read_text().count("data:image/png;base64,") == 3


def test_configs_file(tmp_path) -> None:
    path = tmp_path / "configs.json"
    path.write_text(json.dumps([{"name": "basic", "flags": "--level basic"}, "--no-arena"]))
    res = _bench(
        "demo:mlp", "--runs", "5", "--warmup", "0", "--no-roofline", "--json", "--no-samples", "--configs", str(path)
    )
    assert res.exit_code == 0, res.output
    doc = json.loads(res.stdout)
    assert [c["settings"]["level"] for c in doc["configs"]] == ["all", "basic", "all"]
    assert doc["configs"][2]["settings"]["enable_cpu_mem_arena"] is False
    assert "samples_ms" not in doc["configs"][0]


def test_table_output() -> None:
    res = _bench("demo:mlp", "--runs", "10", "--warmup", "1", "--no-roofline")
    assert res.exit_code == 0, res.output
    for word in ("p50", "p999", "p50 95% CI", "inferences/s", "session create", "peak RSS"):
        assert word in res.stdout


@pytest.mark.parametrize(
    "args, message",
    [
        (["--runs", "0"], "positive"),
        (["--runs", "-3"], "positive"),
        (["--duration", "0"], "positive"),
        (["--runs", "5", "--duration", "1"], "not both"),
        (["--concurrency", "300"], "between 1 and 256"),
        (["--warmup", "lots"], "auto"),
        (["--vs", "--bogus 3"], "No such option"),
        (["--vs", "--threads"], "requires an argument"),
        (["--free-dim", "batch=0"], "positive"),
    ],
)
def test_bad_input_exits_2(args, message) -> None:
    res = _bench("demo:mlp", "--no-roofline", *args)
    assert res.exit_code == 2, res.output
    assert message in res.stderr
    assert "Traceback" not in res.stderr


def test_unknown_flag_and_contradicting_shape_exit_2() -> None:
    assert _bench("demo:mlp", "--bogus").exit_code == 2
    res = _bench("demo:cnn", "--shape", "image=1x3", "--runs", "1", "--no-roofline")
    assert res.exit_code == 2 and "rank" in res.stderr


def test_failing_run_exits_1_with_partial_stats(tmp_path) -> None:
    model = flaky_model()
    call = failing_call(model)
    path = tmp_path / "flaky.onnx"
    path.write_bytes(model.SerializeToString())
    res = _bench(str(path), "--runs", str(call + 50), "--warmup", "0", "--no-roofline", "--json")
    assert res.exit_code == 1
    doc = json.loads(res.stdout)
    assert doc["failure"]["run_index"] == call - 1 and doc["runs"] == call - 1
    assert f"run {call - 1}" in res.stderr
