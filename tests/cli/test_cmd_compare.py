"""``ortpilot compare``: its JSON document, exit 1 past an explicit tolerance, each output's metric printed with
its evidence (a folder's included), and exit 2 for a bad ``--metric``."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner
from metric_models import classifier_folder, save, sentence_folder, three_outputs

from ortpilot.cli.main import cli


def test_compare_cli_json_and_tolerance_exit_code(demo_paths):
    from ortpilot.cli.main import cli

    runner = CliRunner()
    res = runner.invoke(cli, ["compare", str(demo_paths["mlp"]), str(demo_paths["mlp"]), "--json"])
    assert res.exit_code == 0, res.output
    doc = json.loads(res.stdout)
    assert doc["passed"] and {"max_abs", "p99_rel", "cosine", "snr_db", "min_atol", "min_rtol"} <= set(
        doc["outputs"][0]
    )
    # Different models (different seeds) exceed an explicit tolerance: exit 1 naming the output.
    from ortpilot.artifacts.atomic import save_model
    from ortpilot.models import make_mlp

    other = save_model(make_mlp(seed=1), demo_paths["mlp"].parent / "mlp_seed1.onnx")
    res = runner.invoke(cli, ["compare", str(demo_paths["mlp"]), str(other), "--atol", "1e-6"])
    assert res.exit_code == 1
    assert "exceed the given tolerances" in res.output and "minimum tolerance" in res.output


@pytest.fixture(scope="module")
def three(tmp_path_factory):
    return save(three_outputs(), tmp_path_factory.mktemp("three") / "three.onnx")


def test_compare_prints_each_metric_with_its_evidence(three):
    res = CliRunner().invoke(cli, ["compare", str(three), str(three), "--json"])
    assert res.exit_code == 0, res.output
    outputs = {o["name"]: o for o in json.loads(res.stdout)["outputs"]}
    assert outputs["embedding"]["metric"] == "cosine"
    assert outputs["embedding"]["metric_evidence"] == "float vector [batch, 384], no class evidence"
    assert (outputs["p"]["metric"], outputs["p"]["metric_evidence"]) == ("top1", "produced by Softmax through Identity")
    assert (outputs["ids_out"]["metric"], outputs["ids_out"]["error"]) == ("exact", 0)
    res = CliRunner().invoke(cli, ["compare", str(three), str(three), "--metric", "p=rel_l2"])
    said = " ".join(res.output.split())
    assert res.exit_code == 0 and "p: gate metric rel_l2 (set by --metric)" in said
    assert "ids_out: gate metric exact (int64 output: compared exactly)" in said


@pytest.mark.parametrize(
    ("flag", "message"),
    [("nope=cosine", "Its outputs: embedding, p, ids_out"), ("p=l1", "Valid metrics: cosine, top1, rel_l2")],
)
def test_compare_refuses_a_bad_metric_with_exit_2(three, flag, message):
    res = CliRunner().invoke(cli, ["compare", str(three), str(three), "--metric", flag])
    assert res.exit_code == 2 and message in " ".join(res.output.split()) and "Traceback" not in res.output


def test_a_folder_given_to_compare_gives_its_evidence(tmp_path):
    st = sentence_folder(tmp_path / "st")
    res = CliRunner().invoke(cli, ["compare", str(st), str(st / "model.onnx"), "--json"])
    assert res.exit_code == 0, res.output
    (out,) = json.loads(res.stdout)["outputs"]
    assert out["metric"] == "pooled_cosine" and out["error"] == 0
    assert out["metric_evidence"] == "1_Pooling/config.json: mean pooling of [batch, sequence, 16] under attention_mask"
    cls = classifier_folder(tmp_path / "cls")
    res = CliRunner().invoke(cli, ["compare", str(cls), str(cls), "--json"])
    (out,) = json.loads(res.stdout)["outputs"]
    assert (out["metric"], out["metric_evidence"]) == ("top1", "config.json: BertForSequenceClassification")
