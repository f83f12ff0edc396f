"""Typed pass steps (ids and labels as journals know them), the journal's format version, replay."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from ortpilot.cli.main import cli
from ortpilot.passes.fusion import FusionPass
from ortpilot.passes.quantize import QuantizePass
from ortpilot.passes.registry import Step
from ortpilot.tuning import tune
from ortpilot.tuning.candidate import Candidate, baseline_candidate
from ortpilot.tuning.journal import JOURNAL_VERSION, check_record, read_journal
from ortpilot.tuning.space import DYN_W_PC, GQA, QDQ_PC, W4, with_exclusions

FUSION = {"pass": "fusion", "model_type": "bert", "num_heads": 4, "hidden_size": 64}


def test_candidate_ids_and_labels_are_those_journals_written_before_typed_steps_hold():
    """The ids (hashes of the canonical step JSON) and labels of ortpilot before steps had types:
    a journal written then still finds its finished candidates."""
    cands = [
        baseline_candidate(),
        Candidate((dict(FUSION), dict(DYN_W_PC))),
        Candidate((dict(QDQ_PC),)).with_settings(intra_op_threads=1),
        with_exclusions(Candidate((dict(FUSION), dict(DYN_W_PC))), ["b", "a"]),
        Candidate((dict(GQA), dict(W4))).with_iobinding(),
    ]
    assert [(c.id, c.label, c.model_key) for c in cands] == [
        ("d7d143d49912", "ORT default", "4f53cda18c2baa0c"),
        ("7812bdc75a7c", "fusion(bert) · int8-dynamic-w-pc", "471ba89af7973eec"),
        ("891a83fb9fe5", "int8-qdq-pc · intra=1", "545501da4d9a3385"),
        ("837f11674af7", "fusion(bert) · int8-dynamic-w-pc-x2", "0c5815c66ad5a852"),
        ("28b7ae07e1ea", "gqa · int4-weights · iobinding", "de20e9bbd9c462ed"),
    ]
    assert cands[3].passes[-1]["exclude"] == ["a", "b"]


def test_a_step_builds_its_registered_pass_and_reads_as_its_json():
    step = Step.of(
        {
            "pass": "quantize",
            "mode": "dynamic",
            "per_channel": True,
            "weights_only": True,
            "reduce_range": True,
            "exclude": ["n1"],
        }
    )
    quant = step.build()
    assert isinstance(quant, QuantizePass) and quant.mode == "dynamic" and quant.nodes_to_exclude == ["n1"]
    assert quant.label() == step.label() == "int8-dynamic-w-pc-rr-x1"
    assert step["pass"] == "quantize" and step.get("exclude") == ["n1"] and dict(step) == step.to_dict()
    assert step == {**step.to_dict()} and step.with_options(exclude=None).get("exclude") is None
    assert Step.of(step.to_dict()) == step
    fused = Step.of(FUSION).build()
    assert isinstance(fused, FusionPass) and fused.label() == "fusion(bert)" and fused.num_heads == 4
    assert Step("no_such_pass").label() == "no_such_pass"
    with pytest.raises(ValueError, match="unknown pass 'no_such_pass'"):
        Step("no_such_pass").build()
    calibrated = Step("quantize", {"mode": "qdq"}).build(calibration=[{"x": 0}], prepared=True)
    assert calibrated.calibrated and calibrated.calibration == [{"x": 0}] and not calibrated.preprocess


def test_a_rank_record_as_the_tune_writes_it_reads_back():
    """Follow-up rankings journal reduce_range and weight_type; a resume must accept them."""
    record = {
        "kind": "rank",
        "id": "0123456789ab",
        "passes": [],
        "per_channel": True,
        "op_types": ["MatMul"],
        "reduce_range": False,
        "weight_type": "qint8",
        "status": "ok",
        "error": None,
        "ranking": [{"node": "mm1", "op_type": "MatMul", "tensor": "x", "nsr": 0.1, "sqnr_db": 10.0}],
    }
    assert check_record(json.dumps(record).encode(), None, 1) == record


def _edit_start(path, **changes):
    lines = path.read_text().splitlines()
    start = json.loads(lines[0])
    assert start["kind"] == "start"
    start.update(changes)
    for key in [k for k, v in changes.items() if v is None]:
        del start[key]
    path.write_text("\n".join([json.dumps(start), *lines[1:]]) + "\n")


def test_journals_without_a_format_version_resume_and_another_version_is_refused(tmp_path, demo_paths):
    out, model = tmp_path / "out", str(demo_paths["mlp"])
    first = tune(model, out, budget_s=8, quantize=False)
    journal = out / "journal.jsonl"
    assert read_journal(journal)[0]["journal_version"] == JOURNAL_VERSION
    _edit_start(journal, journal_version=None)  # as ortpilot wrote it before the journal had a version
    again = tune(model, out, budget_s=8, quantize=False, resume=True)
    assert again.resumed and again.winner.candidate.id == first.winner.candidate.id
    assert again.speedup == first.speedup  # replayed, nothing measured again
    _edit_start(journal, journal_version=JOURNAL_VERSION + 1)
    before = journal.read_bytes()
    result = CliRunner().invoke(cli, ["tune", model, "-o", str(out), "--budget", "8", "--no-quantize", "--resume"])
    assert result.exit_code == 2, result.output
    assert f"journal format {JOURNAL_VERSION + 1}" in result.output and "Traceback" not in result.output
    assert journal.read_bytes() == before  # a refused resume writes nothing
