"""``ortpilot tune``: with no arguments it writes its four outputs and the profile reproduces the winner
exactly; ``--json`` is one document; the gate metrics it prints with their evidence, its one warning for a
gate on few samples, its candidate table's ratios (interleaved or labelled as search-phase estimates), and
exit 2 for a bad ``--metric``."""

from __future__ import annotations

import json

import numpy as np
import pytest
from click.testing import CliRunner
from metric_models import save, three_outputs

import ortpilot
from ortpilot.cli.main import cli
from ortpilot.tuning.reference import array_digest as _digest
from ortpilot.tuning.reference import reference_feeds
from ortpilot.tuning.report import table_rows


def test_tune_without_arguments_writes_outputs_and_profile_reproduces_winner(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(cli, ["tune", "--budget", "25"])
    assert result.exit_code == 0, result.output
    out = tmp_path / "ortpilot-out"
    for name in ("model.onnx", "profile.json", "report.html", "report.md"):
        assert (out / name).is_file(), name
    said = " ".join(result.output.split())  # rich wraps long lines: a winner's label can push "default" down
    profile = json.loads((out / "profile.json").read_text())
    if profile["default_best"]:  # the headline says what the profile holds, and nothing else
        untried = "candidates were not measured within the budget" in said or "candidate was not" in said
        assert ("ORT's default session ships:" if untried else "ORT's default session was already best:") in said
        assert "Winner:" not in said and not (untried and "already best" in said)
    else:
        ratio = profile["latency"]["speedup_vs_default"]["ratio"]
        assert f"Winner: {profile['candidate']['label']} — {ratio:.2f}x ORT's default on p50" in said
        assert "already best" not in said
    assert profile["model"]["file"] == "model.onnx"
    assert profile["accuracy"]["passed"] is True
    assert "data:image/png;base64," in (out / "report.html").read_text()

    sess = ortpilot.load_profile(str(out / "profile.json"))
    # The tune's own held-out sample, regenerated from the source model (checked by its hash): a
    # fused winner hides the embedding Gather, so inputs generated from it would differ.
    feeds = reference_feeds(profile)
    outputs = sess.run(None, feeds)
    names = [o.name for o in sess.get_outputs()]
    expected = profile["reference_outputs"]["sha256"]
    # Bit-exact: ORT's CPU kernels are deterministic for a fixed thread count, and the profile
    # recreates the winner's settings (threads included).
    assert expected and {n: _digest(o) for n, o in zip(names, outputs)} == expected
    assert sess.profile["candidate"]["id"] == profile["candidate"]["id"]


def test_tune_json_is_one_document(tmp_path, demo_paths):
    # -p names the providers searched (a chain the request keeps as a tuple: it is a chain, not one pair)
    args = ["tune", str(demo_paths["mlp"]), "-o", str(tmp_path / "o"), "--budget", "12", "--no-quantize", "--json"]
    result = CliRunner().invoke(cli, [*args, "-p", "cpu"])
    assert result.exit_code == 0, result.stderr
    doc = json.loads(result.stdout)
    assert {p["name"] for c in doc["candidates"] for p in c["providers"]} == {"CPUExecutionProvider"}
    assert doc["baseline"]["label"] == "ORT default"
    assert {c["status"] for c in doc["candidates"]} <= {
        "ok",
        "rejected",
        "failed",
        "crashed",
        "skipped",
        "budget",
        "timeout",
    }
    assert np.isfinite(doc["speedup"]["ratio"])


def test_an_ep_none_of_whose_candidates_ran_is_named_on_the_console_with_its_error(tmp_path, demo_paths):
    """The profile then runs on the CPU EP: a user who asked for that EP reads why in the terminal."""
    import onnxruntime as ort

    if "CUDAExecutionProvider" in ort.get_available_providers():
        pytest.skip("this ORT build has CUDA: its candidates can run")
    args = ["tune", str(demo_paths["mlp"]), "-o", str(tmp_path / "o"), "--budget", "10", "--no-quantize"]
    result = CliRunner().invoke(cli, [*args, "-p", "cpu", "-p", "cuda"])
    assert result.exit_code == 0, result.stderr
    said = " ".join(result.stderr.split())
    assert "CUDA: none of its candidates ran (" in said and "so the profile does not use it" in said
    assert "CUDAExecutionProvider is not in this ORT build" in said  # the first failure's own reason


@pytest.fixture(scope="module")
def tuned(tmp_path_factory):
    """One short tune of a model with a float vector, a Softmax output and an int64 passthrough."""
    folder = tmp_path_factory.mktemp("tune")
    model = save(three_outputs(), folder / "three.onnx")
    out = folder / "out"
    res = CliRunner().invoke(
        cli,
        ["tune", str(model), "-o", str(out), "--budget", "15", "--no-quantize", "--metric", "p=rel_l2", "--json"],
    )
    assert res.exit_code == 0, res.output
    return json.loads(res.stdout), " ".join(res.stderr.split()), out


def test_tune_prints_each_metric_with_its_evidence(tuned):
    doc, said, out = tuned
    assert doc["metrics"] == {"embedding": "cosine", "p": "rel_l2", "ids_out": "exact"}
    assert doc["metric_evidence"] == {
        "embedding": "float vector [batch, 384], no class evidence",
        "p": "set by --metric",
        "ids_out": "int64 output: compared exactly",
    }
    assert (
        "Accuracy gate per output: embedding: cosine (float vector [batch, 384], no class evidence); "
        "p: rel_l2 (set by --metric); ids_out: exact (int64 output: compared exactly)" in said
    )
    assert "p: rel_l2 (set by --metric)" in (out / "report.md").read_text()
    profile = json.loads((out / "profile.json").read_text())
    assert {o["name"]: o["metric"] for o in profile["accuracy"]["outputs"]} == doc["metrics"]


def test_a_tune_gated_on_4_samples_says_so(tuned):
    doc, said, out = tuned
    assert doc["gate_samples"] == 4 and "fewer than 16" in doc["gate_warning"]
    # one message says it all once, as the tune starts: generated inputs, too few, and what to pass
    assert "NO GATE DATA: the accuracy gate is decided on 4 synthetic inputs" in said
    assert said.count("synthetic input") == said.count("fewer than 16") == said.count("--calibration-text") == 1
    assert "fewer than 16" in (out / "report.md").read_text()


def test_every_ratio_says_whether_it_is_interleaved_or_a_search_estimate(tuned):
    doc, said, out = tuned
    rows = [*doc["candidates"], doc["winner"]]
    assert all(c["vs_default"]["timing"] in ("interleaved", "search") for c in rows)
    interleaved = [c for c in doc["candidates"] if c["timing"] == "interleaved"]
    assert doc["baseline"]["timing"] == "interleaved" and 2 <= len(interleaved) <= 3  # finalists + the default
    if doc["winner"]["vs_default"]["timing"] == "interleaved" and not doc["default_best"]:
        # the table's figure for the winner is the headline's: both come from the interleaved measurement
        assert doc["winner"]["vs_default"]["ratio"] == pytest.approx(doc["speedup"]["ratio"])
        assert "interleaved final measurement" in said
    searched = [c for c in doc["candidates"] if c["status"] == "ok" and c["vs_default"]["timing"] == "search"]
    report = (out / "report.md").read_text()
    for c in searched:  # like with like: each timed beside the default in the search, and labelled so
        expected = doc["baseline"]["paired_cost"] / c["paired_cost"]
        assert c["vs_default"]["ratio"] == pytest.approx(expected)
        assert f"| ~{expected:.2f}x |" in report  # in the search column, never the final one
    for c in interleaved:  # the final columns hold the final's figures, and the search ones their estimates
        final = doc["baseline"]["latency"]["p50_ms"] / c["latency"]["p50_ms"]
        assert f"| {final:.2f}x |" in report
    assert "search-phase estimate" in said and "search-phase estimate" in report
    shown = table_rows(doc)  # the terminal table always holds the two rows the headline compares
    assert {doc["winner"]["id"], doc["baseline"]["id"]} <= {c["id"] for c in shown} and len(shown) <= 6


@pytest.mark.parametrize(
    ("flag", "message"),
    [("logits=top1", "Its outputs: embedding, p, ids_out"), ("p=l2", "Valid metrics: cosine, top1, rel_l2, exact")],
)
def test_tune_refuses_a_bad_metric_with_exit_2_before_any_work(tmp_path, flag, message):
    model = save(three_outputs(), tmp_path / "three.onnx")
    res = CliRunner().invoke(cli, ["tune", str(model), "-o", str(tmp_path / "out"), "--metric", flag])
    assert res.exit_code == 2 and message in " ".join(res.output.split()) and "Traceback" not in res.output
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").iterdir())


def test_tune_refuses_bad_outputs_with_exit_2_before_anything_is_written(tmp_path):
    from output_models import write_encoder_with_heads

    model = write_encoder_with_heads(tmp_path / "encoder3.onnx")
    out = tmp_path / "out"
    res = CliRunner().invoke(cli, ["tune", str(model), "-o", str(out), "--outputs", "logits"])
    said = " ".join(res.output.split())
    assert res.exit_code == 2, res.output
    assert "'logits', which the model does not output; its outputs are: last_hidden_state, pooler_output, " in said
    assert "Traceback" not in res.output and not out.exists()
    res = CliRunner().invoke(cli, ["tune", str(model), "-o", str(out), "--outputs", "token_type_ids"])
    assert res.exit_code == 2 and "('token_type_ids' is an input)" in " ".join(res.output.split())


def test_tune_refuses_an_output_that_is_also_a_graph_input_with_exit_2(tmp_path):
    """A model that returns one of its inputs as it was fed: nothing to compute, time or gate for it."""
    from onnx import TensorProto, helper

    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])
    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "echo", [x], [y, x])
    model = save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), tmp_path / "echo.onnx")
    out = tmp_path / "out"
    res = CliRunner().invoke(cli, ["tune", str(model), "-o", str(out), "--outputs", "y", "--outputs", "x"])
    said = " ".join(res.output.split())
    assert res.exit_code == 2, res.output
    assert "'x', which is also a graph input" in said and "Name outputs the model computes (y)" in said
    assert "Traceback" not in res.output and not out.exists()


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--batch", "0,8"], "--batch sizes must be from 1 to"),
        (["--batch", "eight"], "--batch takes batch sizes like 1,8,32"),
        (["--workload", "nosuch.json"], "--workload 'nosuch.json' is not a file"),
        (["--workload", "w.json"], "names dims the model does not have (width)"),
    ],
)
def test_a_bad_workload_or_batch_is_exit_2_before_anything_is_written(tmp_path, monkeypatch, args, message):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "w.json").write_text(json.dumps({"dims": {"width": {"160": 3}}}))
    result = CliRunner().invoke(cli, ["tune", "demo:encoder", "-o", "out", "--budget", "20", *args])
    assert result.exit_code == 2, result.output
    assert message in " ".join(result.output.split())
    assert not (tmp_path / "out").exists()
