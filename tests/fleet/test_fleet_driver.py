"""The fleet driver (``fleet.run.tune_cluster``) on an in-process cluster (``inprocess.InProcessCluster``):
the searches are real local tunes of demo:mlp in child processes, the nodes are records of this machine's
classes (2 CPUs and 1 CPU), and a search can be stopped after a message to play a dead node or worker.
What the two-node Ray test (tests/serve/test_fleet_two_nodes.py) shows on Ray, here in seconds: the
bundle, a search resumed elsewhere from its journal, a class left missing, ``--outputs`` on the nodes.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import onnx
import pytest
from inprocess import InProcessCluster

import ortpilot
from ortpilot.artifacts.bundle import check_files, read_bundle
from ortpilot.errors import FleetError
from ortpilot.fleet.payload import unpack
from ortpilot.fleet.run import FLEET_DIR, tune_cluster
from ortpilot.models import demo_model_path
from ortpilot.providers.machineclass import this_class
from ortpilot.tuning.journal import JOURNAL_NAME, read_journal
from ortpilot.tuning.request import TuneRequest

BUDGET_S = 10

pytestmark = pytest.mark.skipif(
    len(os.sched_getaffinity(0)) < 2, reason="two classes need a machine with two CPUs (a node of 2 and one of 1)"
)


def _request(out: Path, **fields) -> TuneRequest:
    # no INT8 and no session knobs: a real search, short (what these tests check is the fleet's part)
    return TuneRequest(out_dir=str(out), budget_s=BUDGET_S, quantize=False, session_knobs=False, **fields)


def _records(folder: Path) -> list[dict]:
    return read_journal(folder / JOURNAL_NAME)


def _journal_of(message: dict, into: Path) -> list[dict]:
    """The journal records a ``journal`` message carried."""
    unpack(message["data"], into)
    return _records(into)


def test_two_classes_tune_into_one_bundle_with_a_profile_each(tmp_path):
    cluster = InProcessCluster([("two-cpu1", 2), ("one-cpu1", 1)])
    two, one = this_class(2), this_class(1)
    lines: list[str] = []
    result = tune_cluster(["demo:mlp"], cluster, _request(tmp_path / "mlp"), progress=lines.append)

    assert result.complete and [m.name for m in result.models] == ["mlp"]
    bundle = read_bundle(tmp_path / "mlp")
    assert bundle.complete and not bundle.missing and sorted(bundle.names()) == sorted([two.name, one.name])
    assert bundle.doc["model"]["source"] == "demo:mlp" and bundle.doc["tuned"] == "one after the other"
    assert "share one host" in bundle.doc["schedule"]["why"]
    node_of = {two.name: "two-cpu1", one.name: "one-cpu1"}
    for entry in bundle.entries:
        check_files(bundle, entry)
        assert entry.record["node"]["id"] == node_of[entry.name] and entry.record["attempts"] == 1
        sess = ortpilot.load_profile(tmp_path / "mlp", machine_class=entry.name)
        assert sess.bundle.chosen.name == entry.name
        assert sess.profile["machine_class"] == entry.machine_class  # the child's class is the node's
        assert sess.profile["session_settings"]["intra_op_threads"] <= entry.key["cpus"]
        assert sess.profile["source_model"]["path"] == str(Path(demo_model_path("mlp")).resolve())
    spans = sorted((c.start_s, c.end_s) for c in result.models[0].classes)
    assert spans[0][1] <= spans[1][0]  # one host: one search at a time
    for stream in cluster.streams:  # each node got the request whole, its own CPUs, no journal
        assert stream.journal is None and stream.job.cpus == {"two-cpu1": 2, "one-cpu1": 1}[stream.node]
        assert TuneRequest.from_dict(stream.job.request) == _request(tmp_path / "mlp")
        assert stream.received[0]["kind"] == "started" and stream.received[-1]["kind"] == "done"
    assert lines[0].startswith("Cluster in-process: 2 node(s) on 1 host(s), 2 machine class(es)")
    assert any(
        line.startswith(f"Wrote {tmp_path / 'mlp' / 'bundle.json'} (2 of 2 classes, complete)") for line in lines
    )
    # the journals stay beside the bundle for a later --resume, and are not part of it
    for name in (two.name, one.name):
        assert _records(tmp_path / "mlp" / FLEET_DIR / "mlp" / name)[-1]["kind"] == "done"
        assert not (tmp_path / "mlp" / name / JOURNAL_NAME).exists()


def test_a_catalogue_tunes_into_one_bundle_per_model_one_search_at_a_time(tmp_path):
    """Several MODELs: one bundle each under OUTDIR, named by the model, their searches planned together and run
    one after the other (the real-Ray twin, four searches on two nodes, runs in a full run: tests/serve)."""
    cluster = InProcessCluster([("one-cpu1", 1)])
    one = this_class(1).name
    lines: list[str] = []
    result = tune_cluster(["demo:mlp", "demo:cnn"], cluster, _request(tmp_path / "cat"), progress=lines.append)

    assert result.complete and [m.name for m in result.models] == ["mlp", "cnn"]
    spans = sorted((c.start_s, c.end_s) for m in result.models for c in m.classes)
    assert len(spans) == 2 and spans[0][1] <= spans[1][0]  # one node: one search at a time
    assert len(result.plan["assignments"]) == 2 and not result.plan["concurrent"]
    assert sorted(stream.job.source_label for stream in cluster.streams) == ["demo:cnn", "demo:mlp"]
    for name in ("mlp", "cnn"):
        bundle = read_bundle(tmp_path / "cat" / name)
        assert bundle.complete and bundle.doc["model"]["source"] == f"demo:{name}" and bundle.names() == [one]
        check_files(bundle, bundle.entries[0])
        assert ortpilot.load_profile(tmp_path / "cat" / name, machine_class=one).bundle.chosen.name == one
    assert any(line.startswith(f"Wrote {tmp_path / 'cat' / 'cnn' / 'bundle.json'}") for line in lines), lines


@pytest.mark.parametrize("how", ["node", "worker"])
def test_a_search_stopped_after_its_first_journal_resumes_on_another_node_of_its_class(tmp_path, how):
    cluster = InProcessCluster([("one-cpu1", 1), ("one-cpu2", 1)])
    cluster.die(after="journal", how=how)  # whichever node takes the search first
    one = this_class(1).name
    lines: list[str] = []
    result = tune_cluster(["demo:mlp"], cluster, _request(tmp_path / "mlp"), progress=lines.append)

    first, second = cluster.streams
    assert first.node != second.node and first.journal is None
    sent = [m for m in first.received if m["kind"] == "journal"]
    assert len(sent) == 1 and first.received[-1] is sent[0]  # stopped right after its first journal
    assert second.journal == sent[0]["data"]  # the resume started from what the driver kept
    assert second.received[-1]["kind"] == "done"

    why = "died during its search (NodeDiedError)" if how == "node" else "the Ray worker running its search"
    assert any(why in line and "it resumes from its journal" in line for line in lines), lines
    assert any(line.startswith(f"{one}: resuming on node {second.node}") for line in lines), lines
    outcome = result.models[0].classes[0]
    assert [a["node"] for a in outcome.attempts] == [first.node, second.node]
    assert outcome.summary is not None and outcome.summary.resumed

    # the journal shows the first attempt's records, then the resumed search's, under one start record
    before = _journal_of(sent[0], tmp_path / "first")
    after = _records(tmp_path / "mlp" / FLEET_DIR / "mlp" / one)
    assert before and after[: len(before)] == before and after[-1]["kind"] == "done"
    assert [r["kind"] for r in after].count("start") == 1
    bundle = read_bundle(tmp_path / "mlp")
    assert bundle.complete and bundle.names() == [one]
    entry = bundle.entries[0]
    assert entry.record["attempts"] == 2 and entry.record["node"]["id"] == second.node
    check_files(bundle, entry)
    assert ortpilot.load_profile(tmp_path / "mlp", machine_class=one).profile["machine_class"]["name"] == one


def test_a_class_whose_only_node_dies_leaves_an_incomplete_bundle_until_resume(tmp_path):
    cluster = InProcessCluster([("two-cpu1", 2), ("one-cpu1", 1)])
    cluster.die("one-cpu1", after="journal", how="node")
    two, one = this_class(2).name, this_class(1).name
    out = tmp_path / "mlp"
    with pytest.raises(FleetError) as failed:
        tune_cluster(["demo:mlp"], cluster, _request(out), progress=lambda line: None)

    assert failed.value.exit_code == 1
    message = str(failed.value)
    assert f"{one} of demo:mlp ({out})" in message
    assert "node one-cpu1 (127.0.0.1) died during its search (NodeDiedError)" in message
    assert f"no other node of class {one} is alive" in message and "--resume" in message
    assert two not in message
    bundle = read_bundle(out)
    assert not bundle.complete and bundle.names() == [two]
    assert [(m["class"]["name"], m["nodes"]) for m in bundle.missing] == [(one, ["one-cpu1"])]
    assert not (out / one).exists()
    assert ortpilot.load_profile(out, machine_class=two).bundle.chosen.name == two  # the tuned class loads
    kept = _records(out / FLEET_DIR / "mlp" / one)  # what the dead node streamed before it died
    assert kept

    # a node of the class is back: --resume replays the finished class and resumes the other from its journal
    cluster.add("one-cpu2", 1)
    lines: list[str] = []
    result = tune_cluster(["demo:mlp"], cluster, _request(out, resume=True), progress=lines.append)
    assert result.complete and read_bundle(out).complete
    assert any(line.startswith(f"{one}: resuming on node one-cpu2") for line in lines), lines
    resumed = {c.name: c.summary for c in result.models[0].classes}
    assert resumed[one].resumed and resumed[two].resumed
    assert _records(out / FLEET_DIR / "mlp" / one)[: len(kept)] == kept
    for name in (two, one):
        assert ortpilot.load_profile(out, machine_class=name).bundle.chosen.name == name


def _two_output_mlp(path: Path) -> Path:
    """demo:mlp with its hidden layer exported as a second output, ``hidden``."""
    model = onnx.load(demo_model_path("mlp"))
    width = next(i for i in model.graph.initializer if i.name == "fc2.weight").dims[0]
    model.graph.node.append(onnx.helper.make_node("Identity", ["fc1/Relu"], ["hidden"]))
    model.graph.output.append(onnx.helper.make_tensor_value_info("hidden", onnx.TensorProto.FLOAT, ["batch", width]))
    onnx.checker.check_model(model)
    onnx.save_model(model, path)
    return path


def test_outputs_reach_the_nodes_and_each_class_records_the_pruned_outputs(tmp_path):
    model = _two_output_mlp(tmp_path / "mlp2.onnx")
    cluster = InProcessCluster([("one-cpu1", 1)])
    one = this_class(1).name
    result = tune_cluster([str(model)], cluster, _request(tmp_path / "out", outputs=["y"]), progress=lambda line: None)

    assert result.complete
    (stream,) = cluster.streams
    assert stream.job.request["outputs"] == ["y"]
    profile = json.loads((tmp_path / "out" / one / "profile.json").read_text())
    assert profile["outputs"] == ["y"]
    assert [o.name for o in onnx.load(tmp_path / "out" / one / "model.onnx").graph.output] == ["y"]
    assert _records(tmp_path / "out" / FLEET_DIR / "mlp2" / one)[0]["outputs"] == ["y"]
    sess = ortpilot.load_profile(tmp_path / "out", machine_class=one)
    assert [o.name for o in sess.get_outputs()] == ["y"]
