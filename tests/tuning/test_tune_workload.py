"""A tune of the lengths users send: the workload from real sentences, shape buckets gated at each request's
own size, and a profile whose session takes requests at their own size."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

import ortpilot
from ortpilot.artifacts.atomic import atomic_write_json
from ortpilot.data import real_data
from ortpilot.models import text_folder
from ortpilot.session.shaped import ShapedSession
from ortpilot.tuning.report import shape_plan_line

WORDS = [
    "the",
    "model",
    "runs",
    "fast",
    "on",
    "this",
    "machine",
    "and",
    "every",
    "sentence",
    "has",
    "its",
    "own",
    "length",
    "when",
    "users",
    "send",
    "it",
]


def _sentences(path: Path, n: int = 48) -> Path:
    rng = np.random.default_rng(0)
    lines = [" ".join(rng.choice(WORDS, size=int(k))) for k in rng.integers(2, 30, size=n)]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def _tune(folder: Path, text: Path, out: Path):
    data = real_data(text=text, folder=folder)
    return ortpilot.tune(str(folder), str(out), 25, calibration=data, quantize=False)


@pytest.fixture(scope="module")
def masked(tmp_path_factory):
    root = tmp_path_factory.mktemp("masked")
    folder = text_folder(root / "embed")
    result = _tune(folder, _sentences(root / "s.txt"), root / "out")
    return folder, root / "out", result.to_dict()


def test_the_workload_is_the_sentences_at_their_own_length_and_buckets_come_from_it(masked):
    _, out, doc = masked
    workload = doc["workload"]
    (dim,) = workload["dims"]
    assert dim["name"] == "sequence" and dim["min"] < dim["p50"] < dim["max"]
    plan = doc["facts"]["shape_plan"]
    assert plan["dim"] == "sequence" and plan["sizes"][-1] == dim["max"] and len(plan["sizes"]) >= 2
    assert "per request of this workload (sequence" in " ".join(doc_headline(doc).split())
    profile = json.loads((out / "profile.json").read_text())
    assert profile["workload"]["summary"] == workload["summary"] and (out / profile["workload"]["file"]).is_file()


def test_padding_a_masked_encoder_to_its_buckets_passes_the_gate_at_each_requests_own_size(masked):
    _, _, doc = masked
    shaped = [c for c in doc["candidates"] if c.get("shape_plan")]
    assert shaped and shaped[0]["status"] == "ok", shaped[0]["reason"] if shaped else "no bucketed candidate"
    gate = shaped[0]["accuracy"]
    assert (
        gate["worst_error"] < 1e-4
    )  # the worst held-out sentence, padded to its bucket, against the model at its length
    assert "passed the gate" in shape_plan_line(doc) or "Shape plan:" in shape_plan_line(doc)


def test_a_model_whose_padding_leaks_gets_no_buckets_and_the_report_says_why(tmp_path):
    folder = text_folder(tmp_path / "leak", leak=True)
    doc = _tune(folder, _sentences(tmp_path / "s.txt"), tmp_path / "out").to_dict()
    shaped = [c for c in doc["candidates"] if c.get("shape_plan")]
    assert shaped and all(c["status"] == "rejected" for c in shaped)
    assert doc["winner"].get("shape_plan") is None
    line = shape_plan_line(doc)
    assert "rejected by the gate: padding changed the outputs" in line and "does not make padding" in line
    assert line in (tmp_path / "out" / "report.md").read_text()


def test_a_profile_with_a_shape_plan_runs_requests_at_their_own_size(masked, tmp_path):
    _, out, doc = masked
    profile = json.loads((out / "profile.json").read_text())
    profile["shape_plan"] = doc["facts"]["shape_plan"]  # as a tune whose bucketed winner wrote it
    atomic_write_json(out / "profile.json", profile)
    session = ortpilot.load_profile(str(out / "profile.json"))
    assert isinstance(session, ShapedSession)
    plain = ortpilot.load(str(out / "model.onnx"))
    for n in (3, 11, int(profile["shape_plan"]["sizes"][-1]) + 5):
        feeds = {
            "input_ids": np.full((1, n), 7, np.int64),
            "attention_mask": np.ones((1, n), np.int64),
            "token_type_ids": np.zeros((1, n), np.int64),
        }
        got, want = session.run(None, feeds)[0], plain.run(None, feeds)[0]
        assert got.shape == want.shape and np.allclose(got, want, atol=1e-5)
    assert session.served["beyond"] == 1


def doc_headline(doc):
    from ortpilot.tuning.report import headline

    return headline(doc)
