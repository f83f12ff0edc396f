"""``fleet.remote``: the records that cross Ray (``SearchJob``, ``SearchSpec``) and the search a node runs,
called here as the plain generator Ray would stream (the local tune runs for real in ``fleet.child``)."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

from ortpilot.fleet.payload import model_payload, unpack
from ortpilot.fleet.remote import SearchJob, SearchSpec, search
from ortpilot.tuning.journal import JOURNAL_NAME
from ortpilot.tuning.request import TuneRequest


def _job(model: Path, request: TuneRequest, cpus: int = 1) -> SearchJob:
    return SearchJob(model.name, request.to_dict(), cpus, str(model.resolve()), "demo:mlp")


def test_a_job_and_a_spec_round_trip_through_plain_data_and_json(tmp_path, demo_paths):
    request = TuneRequest(
        out_dir="fleet",
        budget_s=20,
        objective="p99",
        max_error=0.01,
        shapes=["x=1x64"],
        metric=["cosine"],
        providers=["cpu"],
        quantize=False,
        session_knobs=False,
        outputs=["y"],
        samples=8,
    )
    job = _job(demo_paths["mlp"], request, cpus=2)
    assert SearchJob.from_dict(job.to_dict()) == job
    assert SearchJob.from_dict(json.loads(json.dumps(job.to_dict()))) == job
    spec = SearchSpec(job, str(tmp_path / "model.onnx"), str(tmp_path / "out"), True, None, str(tmp_path / "r.json"))
    assert SearchSpec.from_dict(spec.to_dict()) == spec
    assert SearchSpec.from_dict(json.loads(json.dumps(spec.to_dict()))) == spec

    # the node's request: the fleet's, on its own copy of the model, into its scratch OUTDIR
    local = spec.request()
    assert local == replace(request, model=spec.model, out_dir=spec.out, resume=True)
    assert (local.outputs, local.quantize, local.session_knobs, local.budget, local.samples) == (
        ("y",),
        False,
        False,
        20.0,
        8,
    )
    assert spec.request(calibration=[1, 2]).calibration == [1, 2]


def test_a_search_streams_that_it_started_its_journal_and_its_profile_folder(tmp_path, demo_paths):
    request = TuneRequest(budget_s=10, quantize=False, session_knobs=False)  # a real search, short
    payload, _ = model_payload(demo_paths["mlp"])
    messages = list(search(_job(demo_paths["mlp"], request), payload, None, None))

    kinds = [m["kind"] for m in messages]
    assert kinds[0] == "started" and kinds[-1] == "done" and "journal" in kinds[1:-1], kinds
    assert messages[0]["node"] == ""  # outside Ray: no node, and no local Ray started to ask
    journal = unpack(next(m for m in reversed(messages) if m["kind"] == "journal")["data"], tmp_path / "journal")
    assert JOURNAL_NAME in journal  # with what a resume needs beside it
    folder = unpack(messages[-1]["folder"], tmp_path / "profile")
    assert {"profile.json", "model.onnx", "reference.npz"} <= set(folder)
    assert JOURNAL_NAME not in folder and not any(f.startswith(".") for f in folder)  # no journal, no state
    profile = json.loads((tmp_path / "profile" / "profile.json").read_text())
    assert profile["source_model"]["path"] == str(demo_paths["mlp"].resolve())  # the asking machine's path
    assert messages[-1]["summary"]["winner"] == profile["candidate"]["label"]
    assert messages[-1]["cpus"] and len(messages[-1]["cpus"]) == 1  # pinned to the node's one CPU


def test_a_search_whose_request_is_bad_fails_with_exit_2_and_no_retry(demo_paths):
    payload, _ = model_payload(demo_paths["mlp"])
    job = _job(demo_paths["mlp"], TuneRequest(budget_s=10, outputs=["nope"]))
    messages = list(search(job, payload, None, None))

    assert [m["kind"] for m in messages] == ["started", "failed"]
    failed = messages[-1]
    assert failed["exit_code"] == 2 and failed["retry"] is False
    assert "--outputs names 'nope', which the model does not output" in failed["message"]
