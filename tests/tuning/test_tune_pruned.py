"""``tune(outputs=...)`` / ``--outputs``: the deployment's outputs only, from the gate to the served model.

One short tune of the demo encoder with a pooler head and an intermediate output beside
``last_hidden_state`` (``tests/output_models.py``), pruned to ``pooler_output``: the model every
candidate is built from, the gate, the reference, OUTDIR's model, the profile, the journal, verify,
export triton and serve's model metadata all hold that one output.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from click.testing import CliRunner
from output_models import write_encoder_with_heads

from ortpilot.cli.main import cli
from ortpilot.errors import UsageError, VerificationError
from ortpilot.tuning import tune
from ortpilot.tuning.journal import read_journal
from ortpilot.tuning.reference import read_reference

WANT = ["pooler_output"]


@pytest.fixture(scope="module")
def tuned(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, object]:
    root = tmp_path_factory.mktemp("pruned")
    model = write_encoder_with_heads(root / "encoder3.onnx")
    out = root / "out"
    return model, out, tune(str(model), out, budget_s=12, outputs=WANT)


def test_the_tuned_model_reference_and_gate_hold_only_the_named_output(tuned) -> None:
    model, out, result = tuned
    assert result.outputs == WANT and result.to_dict()["outputs"] == WANT
    assert list(result.metrics) == WANT  # the gate held only it
    built = onnx.load(out / "model.onnx")
    assert [o.name for o in built.graph.output] == WANT
    assert "hidden_state_1" not in {o for n in built.graph.node for o in n.output}
    inputs, outputs = read_reference(out / "reference.npz")
    assert list(outputs) == WANT
    full = ort.InferenceSession(str(model), providers=["CPUExecutionProvider"])
    want = full.run(WANT, inputs)[0]
    if result.default_best:  # ORT's default on the pruned graph: the full model's values, bit for bit
        np.testing.assert_array_equal(outputs["pooler_output"], want)
    else:
        cos = float(np.dot(outputs["pooler_output"].ravel(), want.ravel()))
        assert cos / (np.linalg.norm(outputs["pooler_output"]) * np.linalg.norm(want)) > 0.99
    every = [e for e in result.entries if e.prepared.get("output_names")]
    assert every and all(e.prepared["output_names"] == WANT for e in every)  # every candidate ran the pruned graph


def test_profile_and_journal_record_the_outputs(tuned) -> None:
    model, out, _ = tuned
    doc = json.loads((out / "profile.json").read_text())
    assert doc["outputs"] == WANT
    assert doc["source_model"]["path"] == str(model)  # the user's model, not the pruned cache entry
    start = next(r for r in read_journal(out / "journal.jsonl") if r["kind"] == "start")
    assert start["outputs"] == WANT
    report = " ".join((out / "report.md").read_text().split())
    assert "pooler_output: cosine" in report and "the model was pruned to them" in report
    assert "last_hidden_state" not in report


def test_a_resume_with_other_outputs_is_refused(tuned) -> None:
    model, out, _ = tuned
    with pytest.raises(UsageError, match="differs in: outputs"):
        tune(str(model), out, budget_s=12, outputs=["last_hidden_state"], resume=True)
    with pytest.raises(UsageError, match="differs in: outputs"):
        tune(str(model), out, budget_s=12, resume=True)  # all outputs is another tune too


def test_verify_passes_and_fails_once_the_recorded_outputs_are_edited_away(tuned, tmp_path) -> None:
    import ortpilot

    _, out, _ = tuned
    res = CliRunner().invoke(cli, ["verify", str(out / "profile.json")])
    assert res.exit_code == 0, res.output
    assert [o.name for o in ortpilot.load_profile(out / "profile.json").get_outputs()] == WANT
    edited = tmp_path / "edited"
    shutil.copytree(out, edited)
    doc = json.loads((edited / "profile.json").read_text())
    doc["outputs"] = ["last_hidden_state"]
    (edited / "profile.json").write_text(json.dumps(doc))
    res = CliRunner().invoke(cli, ["verify", str(edited / "profile.json")])
    assert res.exit_code == 1, res.output
    assert "'last_hidden_state', which its model does not return" in res.output
    assert "Traceback" not in res.output
    with pytest.raises(VerificationError, match="'pooler_output', which the profile does not record"):
        ortpilot.load_profile(edited / "profile.json")
    # export refuses it too: a Triton config would expose outputs the deployment does not read
    repo = tmp_path / "repo"
    res = CliRunner().invoke(cli, ["export", "triton", str(edited / "profile.json"), "-o", str(repo), "--name", "m"])
    assert res.exit_code == 1, res.output
    assert "'last_hidden_state', which its model does not return" in res.output and "Traceback" not in res.output
    assert not (repo / "m").exists()


def test_export_triton_and_serve_metadata_list_only_the_named_output(tuned, tmp_path) -> None:
    from ortpilot.serve.oip.app import model_metadata
    from ortpilot.serve.options import ModelSpec, ServeOptions

    _, out, _ = tuned
    repo = tmp_path / "repo"
    res = CliRunner().invoke(cli, ["export", "triton", str(out / "profile.json"), "-o", str(repo), "--name", "m"])
    assert res.exit_code == 0, res.output
    config = (repo / "m" / "config.pbtxt").read_text()
    assert 'name: "pooler_output"' in config
    assert "last_hidden_state" not in config and "hidden_state_1" not in config
    meta = model_metadata(ModelSpec("m", "profile", str(out / "profile.json")), ServeOptions(), 1.0)
    assert [t["name"] for t in meta["tensors"]["outputs"]] == WANT
    assert [t["name"] for t in meta["tensors"]["inputs"]] == ["input_ids", "attention_mask", "token_type_ids"]


def test_a_tune_reports_a_declared_output_shape_the_model_does_not_return_and_gates_on_the_real_one(tmp_path):
    """The recognizer declares ``387`` as ``[1, seqlen]`` and returns ``[20, 1, 40]`` (steps x classes): the
    tune's result and report.md say so, and the metric comes from what it returns (ctc), not the declaration."""
    from metric_models import ctc_recognizer, save, text_images

    from ortpilot.tuning import tune

    model = save(ctc_recognizer(), tmp_path / "rec.onnx")
    result = tune(
        str(model), tmp_path / "out", budget_s=30, quantize=False, session_knobs=False, calibration=text_images(24)
    )
    assert result.metrics["387"] == "ctc"
    assert "declared [1, seqlen] but returns [20, 1, 40]" in result.metric_evidence["387"]
    report = " ".join((tmp_path / "out" / "report.md").read_text().split())
    assert "declared [1, seqlen] but returns [20, 1, 40]" in report
