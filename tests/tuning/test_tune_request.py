"""``TuneRequest``: one record for a tune's options, their defaults and their checks."""

from __future__ import annotations

import json

import pytest

import ortpilot
from ortpilot.errors import ProviderError, UsageError
from ortpilot.tuning.request import DEMO_BUDGET_S, MODEL_BUDGET_S, OBJECTIVES, TuneRequest
from ortpilot.tuning.tune import as_request


def test_defaults_are_defined_once_and_the_budget_follows_the_model():
    demo, model = TuneRequest(), TuneRequest(model="m.onnx")
    assert demo.budget == DEMO_BUDGET_S and model.budget == MODEL_BUDGET_S
    assert demo.budget_s is None  # the default stays a default: another model gets its own
    assert demo.for_model("m.onnx").budget == MODEL_BUDGET_S
    assert TuneRequest(model="m.onnx", budget_s=42).for_model(None).budget == 42
    assert demo.objective == OBJECTIVES[0] and demo.out_dir == "ortpilot-out" and demo.quantize


def test_arguments_are_normalised_so_requests_compare_and_travel_as_data():
    a = TuneRequest(model="m.onnx", shapes={"input_ids": [1, 16], "batch": 2}, metric="cosine", outputs=["y"])
    assert a.shapes == ("input_ids=1x16", "batch=2") and a.metric == ("cosine",) and a.outputs == ("y",)
    b = TuneRequest(model="m.onnx", shapes=["input_ids=1x16", "batch=2"], metric=["cosine"], outputs=("y",))
    assert a == b
    doc = json.loads(json.dumps(a.to_dict()))
    assert TuneRequest.from_dict(doc) == a


def test_providers_are_checked_when_the_request_is_made_and_kept_as_given():
    req = TuneRequest(providers=["cpu", {"name": "openvino", "options": {"num_of_threads": 1}}])
    assert req.providers[0] == "cpu"
    assert req.providers[1] == {"name": "OpenVINOExecutionProvider", "options": {"num_of_threads": "1"}}
    with pytest.raises(ProviderError, match="Unknown execution provider 'nosuch'"):
        TuneRequest(providers=["nosuch"])
    with pytest.raises(ProviderError, match="The CPU EP takes no provider options"):  # ORT would drop them
        TuneRequest(providers=[{"name": "cpu", "options": {"arena": 1}}])


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"budget_s": 0}, "--budget must be a positive number"),
        ({"budget_s": -3}, "--budget must be a positive number"),
        ({"budget_s": 4}, "leaves no time to search"),
        ({"objective": "p70"}, "Unknown objective 'p70'"),
        ({"samples": 0}, "samples must be a positive whole number"),
        ({"session_knobs": "false"}, "session_knobs must be True or False, got 'false'"),  # a true string
        ({"quantize": 0}, "quantize must be True or False"),
    ],
)
def test_bad_options_are_usage_errors_before_anything_runs(fields, message):
    with pytest.raises(UsageError, match=message):
        TuneRequest(**fields)


def test_in_memory_calibration_does_not_travel_but_a_path_does(tmp_path):
    arrays = {"x": [[1.0, 2.0]]}
    assert TuneRequest(calibration=arrays).to_dict()["calibration"] is None
    assert TuneRequest(calibration=tmp_path / "cal.npz").to_dict()["calibration"] == str(tmp_path / "cal.npz")


def test_from_dict_refuses_fields_it_does_not_know():
    with pytest.raises(UsageError, match="unknown fields: nosuch"):
        TuneRequest.from_dict({"nosuch": 1})


def test_tune_takes_a_request_or_its_fields_not_both():
    req = TuneRequest(model="m.onnx", budget_s=20)
    assert as_request(req) is req
    assert as_request("m.onnx", "out", 20, quantize=False) == TuneRequest(
        model="m.onnx", out_dir="out", budget_s=20, quantize=False
    )
    with pytest.raises(UsageError, match="not both"):
        as_request(req, budget_s=30)
    with pytest.raises(UsageError, match="unknown options: nosuch"):
        as_request("m.onnx", nosuch=1)
    assert ortpilot.TuneRequest is TuneRequest


def test_a_request_runs_a_real_tune_and_its_journal_pins_what_it_asked(tmp_path, demo_paths):
    request = TuneRequest(model=str(demo_paths["mlp"]), out_dir=str(tmp_path / "out"), budget_s=12, quantize=False)
    result = ortpilot.tune(request)
    assert result.to_dict()["winner"]["id"]
    start = json.loads((tmp_path / "out" / "journal.jsonl").read_text().splitlines()[0])
    assert start["kind"] == "start" and start["budget_s"] == 12 and start["quantize"] is False
    # the same request again with resume replays the journal: the same winner, nothing measured again
    again = ortpilot.tune(TuneRequest(**{**request.to_dict(), "resume": True}))
    assert again.to_dict()["winner"]["id"] == result.to_dict()["winner"]["id"]
