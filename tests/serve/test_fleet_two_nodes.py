"""``ortpilot tune --ray`` on a real Ray cluster started on this machine (``ray.cluster_utils.Cluster``): a
head with 2 CPUs and a worker node with 1, two machine classes (the CPU budget differs), two profiles, a
bundle that ``ortpilot serve`` serves on both nodes with each replica verified on its own node's class.
Then what happens when a search loses its Ray worker (it resumes from its journal on another node of its
class) or its node (the bundle is written incomplete, exit 1, and ``--resume`` finishes it once a node of
the class is back). The tests on two nodes are marked ``raycluster`` and share one cluster (``two_nodes``,
tests/serve/conftest.py): ``.ci/run`` runs them as their own step; the one-node case (no node can run a search)
runs in the main suite.

The nodes share this machine, so the classes are tuned one after the other (and the bundle says so);
the budgets are small (demo:mlp stops early, demo:encoder runs its 12 s).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

th = pytest.importorskip("tritonclient.http")

from serve_procs import Server, cli_env, free_port, local_cluster

import ortpilot
from ortpilot.graph.feeds import make_feeds
from ortpilot.models import demo_model_path
from ortpilot.providers.machineclass import this_class

CLI = [sys.executable, "-m", "ortpilot.cli.main"]


def _tune(address: str, out: Path, *extra: str, budget: int = 12, model: str = "demo:mlp") -> subprocess.Popen:
    return subprocess.Popen(
        [*CLI, "tune", model, "--ray", address, "-o", str(out), "--budget", str(budget), "--json", *extra],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=cli_env(),
    )


def _finish(proc: subprocess.Popen, timeout: float = 400) -> tuple[int, dict, str]:
    out, err = proc.communicate(timeout=timeout)
    return proc.returncode, json.loads(out) if out.strip() else {}, err


def test_a_cluster_with_no_node_for_a_search_is_exit_2(tmp_path):
    """A one-node cluster (its head offers no CPU): not marked raycluster, it runs in the main suite."""
    cluster, _ = local_cluster(0)
    try:
        code, _, err = _finish(_tune(cluster.address, tmp_path / "out"), timeout=240)
    finally:
        cluster.shutdown()
    assert code == 2 and err.count("error:") == 1, err
    assert "has no alive node that can run a search" in err and "0 CPUs for Ray tasks" in err
    assert not (tmp_path / "out" / "bundle.json").exists()


@pytest.mark.raycluster
def test_two_classes_two_profiles_one_bundle_served_on_both_nodes(two_nodes, tmp_path):
    address = two_nodes["cluster"].address
    bundle = tmp_path / "mlp"
    started = time.monotonic()
    code, doc, err = _finish(_tune(address, bundle, "--no-session-knobs"))  # the subject is the fleet, not the search
    wall = time.monotonic() - started
    assert code == 0, err[-3000:]
    classes = {c["class"]: c for c in doc["models"][0]["classes"]}
    assert sorted(classes) == sorted([this_class().name, this_class(1).name]) and doc["complete"]
    assert doc["tuned"] == "one after the other" and "share one host" in doc["why"]
    spans = sorted((c["start_s"], c["end_s"]) for c in classes.values())
    assert spans[0][1] <= spans[1][0]  # never two searches on this host at once
    written = json.loads((bundle / "bundle.json").read_text())
    assert written["complete"] and written["tuned"] == "one after the other"
    node_class = {c["node"]["id"]: c["class"]["name"] for c in written["classes"]}
    assert len(node_class) == 2  # each class on its own node
    for entry in written["classes"]:
        profile = json.loads((bundle / entry["folder"] / "profile.json").read_text())
        assert profile["machine_class"] == entry["class"]
        assert profile["session_settings"]["intra_op_threads"] <= entry["class"]["key"]["cpus"]
        assert profile["source_model"]["path"] == str(Path(demo_model_path("mlp")).resolve())
    print(f"\nfleet tune of demo:mlp on 2 classes: {wall:.1f} s wall ({doc['wall_s']:.1f} s inside)")

    server = Server(
        [
            str(bundle),
            "--name",
            "m",
            "--address",
            address,
            "--replicas",
            "2",
            "--cpus-per-replica",
            "1",
            "--debug-info",
        ],
        free_port(),
        tmp_path / "serve.err",
    )
    try:
        assert server.ready and server.ready[0].startswith("m: 2 replicas ready"), server.stderr[-3000:]
        client = th.InferenceServerClient(server.url)
        replicas = client.get_model_metadata("m")["ortpilot"]["replicas"]
        assert {r["node"] for r in replicas} == set(node_class)
        for replica in replicas:  # each replica verified the profile of its own node's class
            assert (
                replica["verified"] and f"class {node_class[replica['node']]} (this machine's class)" in replica["why"]
            )
        sess = ortpilot.load_profile(bundle, machine_class=this_class(1).name, intra_op_threads=1)
        other = ortpilot.load_profile(bundle, intra_op_threads=1)
        for seed in range(4):
            feeds = make_feeds(sess.model, seed=seed)
            item = th.InferInput("x", list(feeds["x"].shape), "FP32")
            item.set_data_from_numpy(feeds["x"])
            got = client.infer("m", [item]).as_numpy(sess.get_outputs()[0].name)
            assert any(got.tobytes() == np.asarray(s.run(None, feeds)[0]).tobytes() for s in (sess, other))
    finally:
        assert server.stop() == 0, server.stderr[-3000:]
    for one_cpu in (False, True):
        verified = subprocess.run(
            [*CLI, "verify", str(bundle), "--json"],
            capture_output=True,
            text=True,
            timeout=240,
            preexec_fn=(lambda: os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})) if one_cpu else None,
        )
        assert verified.returncode == 0, verified.stderr
        chosen = json.loads(verified.stdout)["profiles"][0]["bundle"]["class"]["name"]
        assert chosen == (this_class(1).name if one_cpu else this_class().name)


# Its in-process twin runs in the main suite (tests/fleet/test_fleet_driver.py: a catalogue, one bundle per model);
# this real-Ray one (four searches, the step's longest test) stays for a full run (-m "raycluster and slow").
@pytest.mark.raycluster
@pytest.mark.slow
def test_a_catalogue_tunes_into_one_bundle_per_model_one_search_at_a_time_on_one_host(two_nodes, tmp_path):
    proc = subprocess.Popen(
        [*CLI, "tune", "demo:mlp", "demo:cnn", "--ray", two_nodes["cluster"].address, "-o", str(tmp_path / "cat")]
        + ["--budget", "10", "--json"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=cli_env(),
    )
    code, doc, err = _finish(proc)
    assert code == 0, err[-3000:]
    assert sorted(m["name"] for m in doc["models"]) == ["cnn", "mlp"] and doc["complete"]
    spans = sorted((c["start_s"], c["end_s"]) for m in doc["models"] for c in m["classes"])
    assert len(spans) == 4 and all(a[1] <= b[0] for a, b in zip(spans, spans[1:]))  # one host: one at a time
    assert len(doc["plan"]["assignments"]) == 4 and not doc["plan"]["concurrent"]
    for name in ("mlp", "cnn"):
        written = json.loads((tmp_path / "cat" / name / "bundle.json").read_text())
        assert written["complete"] and written["model"]["source"] == f"demo:{name}" and len(written["classes"]) == 2
        assert ortpilot.load_profile(tmp_path / "cat" / name).bundle.chosen == this_class()


def _child_on_one_cpu(deadline: float) -> int | None:
    """The Ray worker running the 1-CPU class's search: the parent of its ``ortpilot.fleet.child``."""
    while time.monotonic() < deadline:
        for proc in Path("/proc").iterdir():
            try:
                cmd = (proc / "cmdline").read_bytes().split(b"\0")
                if b"ortpilot.fleet.child" not in cmd:
                    continue
                spec = json.loads(Path(cmd[cmd.index(b"ortpilot.fleet.child") + 1].decode()).read_text())
                if spec["job"]["cpus"] == 1:
                    return int((proc / "stat").read_text().split(")")[-1].split()[1])
            except (OSError, ValueError, IndexError, KeyError):
                continue
        time.sleep(0.5)
    return None


def _journal_seen(folder: Path, deadline: float) -> bool:
    while time.monotonic() < deadline:
        if (folder / "journal.jsonl").is_file():
            return True
        time.sleep(0.5)
    return False


# The driver's resume paths run in-process in seconds (tests/fleet/test_fleet_driver.py: a search stopped after
# its first journal resumes on another node of its class; a class whose only node dies leaves an incomplete
# bundle until --resume). These real-Ray twins stay for a full run (-m "raycluster and slow").
@pytest.mark.raycluster
@pytest.mark.slow
def test_a_search_whose_worker_dies_resumes_on_another_node_of_its_class(two_nodes, tmp_path):
    cluster = two_nodes["cluster"]
    spare = cluster.add_node(num_cpus=1, node_ip_address="127.0.0.1")
    cluster.wait_for_nodes()
    try:
        out = tmp_path / "enc"
        proc = _tune(cluster.address, out, model="demo:encoder")
        one = this_class(1).name
        assert _journal_seen(out / ".fleet" / "encoder" / one, time.monotonic() + 180)
        worker = _child_on_one_cpu(time.monotonic() + 60)
        assert worker is not None
        os.kill(worker, signal.SIGKILL)  # the Ray worker running the search (its child dies with it)
        code, doc, err = _finish(proc)
    finally:
        cluster.remove_node(spare)
    assert code == 0, err[-3000:]
    assert "the Ray worker running its search" in err and "it resumes from its journal" in err
    entry = next(c for c in json.loads((out / "bundle.json").read_text())["classes"] if c["class"]["name"] == one)
    assert entry["attempts"] == 2
    attempts = next(c for c in doc["models"][0]["classes"] if c["class"] == one)["attempts"]
    assert attempts[0]["node"] != attempts[1]["node"] == entry["node"]["id"]  # another node of the class
    assert doc["complete"] and ortpilot.load_profile(out, machine_class=one).profile["machine_class"]["name"] == one


@pytest.mark.raycluster
@pytest.mark.slow  # its in-process twin: test_fleet_driver.py (a class whose only node dies)
def test_a_node_that_dies_mid_search_leaves_an_incomplete_bundle_and_resume_finishes_it(two_nodes, tmp_path):
    cluster = two_nodes["cluster"]
    out = tmp_path / "enc"
    one = this_class(1).name
    proc = _tune(cluster.address, out, model="demo:encoder")
    assert _journal_seen(out / ".fleet" / "encoder" / one, time.monotonic() + 180)
    dead = two_nodes["worker"]
    cluster.remove_node(dead)
    code, doc, err = _finish(proc)
    two_nodes["worker"] = cluster.add_node(num_cpus=1, node_ip_address="127.0.0.1")
    cluster.wait_for_nodes()
    assert code == 1, err[-3000:]
    assert err.count("error:") == 1 and f"{one} of demo:encoder" in err
    assert f"node {dead.node_id[:8]}" in err and "died during its search" in err and "--resume" in err
    written = json.loads((out / "bundle.json").read_text())
    assert not written["complete"] and [m["class"]["name"] for m in written["missing"]] == [one]
    assert not doc["complete"]
    assert ortpilot.load_profile(out).bundle.chosen == this_class()  # the class that was tuned loads
    code, doc, err = _finish(_tune(cluster.address, out, "--resume", model="demo:encoder"))
    assert code == 0, err[-3000:]
    assert json.loads((out / "bundle.json").read_text())["complete"] and "resuming on node" in err
