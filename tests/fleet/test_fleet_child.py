"""``fleet.child``: the process a node's search runs in, called here in this process on a spec as
``fleet.remote`` writes it (its CPUs all of this process's, so pinning changes nothing here)."""

from __future__ import annotations

import json
import os
from pathlib import Path

from ortpilot.fleet.child import main
from ortpilot.fleet.remote import SearchJob, SearchSpec
from ortpilot.tuning.request import TuneRequest


def _spec(tmp_path: Path, model: Path, request: TuneRequest) -> Path:
    cpus = len(os.sched_getaffinity(0))
    job = SearchJob(model.name, request.to_dict(), cpus, str(model), "demo:mlp")
    spec = SearchSpec(job, str(model), str(tmp_path / "out"), False, None, str(tmp_path / "result.json"))
    path = tmp_path / "spec.json"
    path.write_text(json.dumps(spec.to_dict()))
    return path


def test_a_bad_request_is_exit_2_with_its_message_in_the_result_file(tmp_path, demo_paths):
    affinity = os.sched_getaffinity(0)
    spec = _spec(tmp_path, demo_paths["mlp"], TuneRequest(budget_s=10, outputs=["y", "nope"]))
    assert main(["child", str(spec)]) == 2
    error = json.loads((tmp_path / "result.json").read_text())["error"]
    assert error["type"] == "UsageError" and error["exit_code"] == 2
    assert error["message"].startswith("--outputs names 'nope', which the model does not output; its outputs are: y.")
    assert not (tmp_path / "out" / "profile.json").exists()
    assert os.sched_getaffinity(0) == affinity
