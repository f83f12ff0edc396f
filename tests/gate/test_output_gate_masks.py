"""The output gate with evidence-chosen metrics: masks of the held-out samples (through the quantize probe and
the tune worker's saved outputs), the few-samples warning, and what ``ortpilot quantize`` prints of it."""

from __future__ import annotations

import json
from dataclasses import replace

import numpy as np
import pytest
from click.testing import CliRunner
from metric_models import padded_samples, save, three_outputs, token_model

from ortpilot.cli.main import cli
from ortpilot.errors import UsageError
from ortpilot.gate.core import ModelGate
from ortpilot.gate.outputs import OutputGate, SampleProbe, SavedOutputs
from ortpilot.gate.result import MIN_GATE_SAMPLES, GateResult, few_samples_warning, gate_data_warning
from ortpilot.tuning.worker import save_samples


@pytest.fixture(scope="module")
def token_models(tmp_path_factory):
    folder = tmp_path_factory.mktemp("tokens")
    return {
        kind: save(token_model(kind, scale=3.0 if kind == "padding" else 0.5), folder / f"{kind or 'ref'}.onnx")
        for kind in (None, "padding", "real")
    }


def test_the_gate_reads_the_held_out_masks_and_ignores_padding(token_models):
    samples = padded_samples()
    probe = SampleProbe(samples)
    masked = ModelGate.of(OutputGate.for_model(token_model(), 0.01, inputs=samples), probe, str(token_models[None]))
    unmasked = ModelGate.of(OutputGate.for_model(token_model(), 0.01, metrics="cosine"), probe, str(token_models[None]))
    padding = masked.measure(str(token_models["padding"]))
    assert padding.passed and padding.checks[0].metric == "masked_cosine" and padding.error < 1e-6
    assert not unmasked.measure(str(token_models["padding"])).passed  # the same change, padding included: fails
    real = masked.measure(str(token_models["real"]))
    assert not real.passed and real.error > 0.01


def test_the_tune_workers_saved_outputs_are_judged_under_the_same_masks(token_models, tmp_path):
    """The tune path: outputs come from the worker's npz, the masks from the held-out samples tune gave it."""
    from ortpilot.measure.compare import run_samples
    from ortpilot.session import load

    samples = padded_samples()
    files = {}
    for kind, path in token_models.items():
        files[kind] = tmp_path / f"{kind}.npz"
        save_samples(files[kind], run_samples(load(str(path), policy="strict", placement=False), samples))
    gate = OutputGate.for_model(token_model(), 0.01)
    with pytest.raises(UsageError, match="needs each sample's attention mask"):  # no held-out inputs: no masks
        ModelGate.of(gate, SavedOutputs(), files[None]).measure(files["padding"])
    tuned = ModelGate.of(replace(gate, inputs=samples), SavedOutputs(), files[None])
    assert tuned.measure(files["padding"]).passed and not tuned.measure(files["real"]).passed


def test_a_gate_on_fewer_than_16_samples_says_so():
    ref = {"y": [np.ones((1, 8), np.float32)] * (MIN_GATE_SAMPLES - 1)}
    few = OutputGate(0.01).check(ref, ref)
    assert "fewer than 16" in few.warning and "fewer than 16" in few.summary
    enough = OutputGate(0.01).check({"y": ref["y"] * 2}, {"y": ref["y"] * 2})
    assert enough.warning == "" and "fewer than" not in enough.summary
    assert GateResult([], samples=0).warning == ""


def test_the_gate_data_warning_says_synthetic_and_few_in_one_message():
    both = gate_data_warning(4, "x=1x64")
    assert "4 synthetic inputs (x=1x64)" in both and "fewer than 16" in both and "--calibration-text" in both
    synthetic = gate_data_warning(MIN_GATE_SAMPLES, "x=1x64")
    assert "synthetic inputs" in synthetic and "fewer than" not in synthetic
    assert gate_data_warning(4) == few_samples_warning(4) and gate_data_warning(MIN_GATE_SAMPLES) == ""


@pytest.fixture(scope="module")
def three(tmp_path_factory):
    folder = tmp_path_factory.mktemp("three")
    rng = np.random.default_rng(0)
    calibration = folder / "calibration.npz"
    np.savez(  # 64 stacked samples: a quarter (16) are held out for the gate
        calibration,
        x=rng.standard_normal((64, 1, 64)).astype(np.float32),
        ids=rng.integers(0, 100, (64, 1, 8)).astype(np.int64),
    )
    return save(three_outputs(), folder / "three.onnx"), calibration


def test_quantize_prints_each_metric_with_its_evidence_and_the_sample_warning(three, tmp_path):
    model, _ = three
    res = CliRunner().invoke(
        cli, ["quantize", str(model), "-o", str(tmp_path / "q.onnx"), "--mode", "dynamic", "--json"]
    )
    assert res.exit_code == 0, res.output
    gate = json.loads(res.stdout)["gate"]
    assert gate["metrics"] == {
        "embedding": {"metric": "cosine", "evidence": "float vector [batch, 384], no class evidence"},
        "p": {"metric": "top1", "evidence": "produced by Softmax through Identity"},
        "ids_out": {"metric": "exact", "evidence": "int64 output: compared exactly"},
    }
    assert gate["samples"] == 1 and "fewer than 16" in gate["warning"]
    by_name = {o["name"]: o for o in gate["comparison"]["outputs"]}
    assert by_name["ids_out"]["error"] == 0  # the passthrough is untouched by INT8
    res = CliRunner().invoke(
        cli, ["quantize", str(model), "-o", str(tmp_path / "q2.onnx"), "--mode", "dynamic", "--metric", "p=cosine"]
    )
    said = " ".join(res.output.split())
    assert res.exit_code == 0, res.output
    assert "p: gate metric cosine (set by --metric)" in said and "embedding: gate metric cosine (float vector" in said


def test_quantize_on_16_held_out_samples_has_no_warning(three, tmp_path):
    model, calibration = three
    res = CliRunner().invoke(
        cli,
        ["quantize", str(model), "-o", str(tmp_path / "q.onnx"), "--mode", "dynamic"]
        + ["--calibration", str(calibration), "--json"],
    )
    assert res.exit_code == 0, res.output
    gate = json.loads(res.stdout)["gate"]
    assert gate["samples"] == 16 and gate["warning"] is None


@pytest.mark.parametrize(
    ("flag", "message"),
    [("logits=top1", "Its outputs: embedding, p, ids_out"), ("cosin", "Valid metrics: cosine, top1, rel_l2, exact")],
)
def test_quantize_refuses_a_bad_metric_with_exit_2_before_writing(three, tmp_path, flag, message):
    model, _ = three
    out = tmp_path / "q.onnx"
    res = CliRunner().invoke(cli, ["quantize", str(model), "-o", str(out), "--mode", "dynamic", "--metric", flag])
    assert res.exit_code == 2 and message in " ".join(res.output.split()) and not out.exists()
