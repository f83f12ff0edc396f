"""Everything that reads a profile reads a bundle: load_profile, verify, export triton and serve's resolver;
and a bundle that was damaged (a missing or edited profile, two profiles for one class) is refused."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from bundles import file_bundle

import ortpilot
from ortpilot.artifacts.bundle import read_bundle
from ortpilot.errors import StampMismatchError, UsageError, VerificationError
from ortpilot.graph.feeds import make_feeds
from ortpilot.providers.machineclass import this_class

CLI = [sys.executable, "-m", "ortpilot.cli.main"]


def _one_cpu():
    return lambda: os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})


def _cli(*args: str, one_cpu: bool = False) -> subprocess.CompletedProcess:
    return subprocess.run(
        [*CLI, *args], capture_output=True, text=True, timeout=240, preexec_fn=_one_cpu() if one_cpu else None
    )


def test_a_bundle_holds_one_hashed_profile_per_class(two_class_bundle):
    bundle = read_bundle(two_class_bundle)
    assert bundle.complete and sorted(bundle.names()) == sorted([this_class().name, this_class(1).name])
    for entry in bundle.entries:
        assert {"profile.json", "model.onnx", "reference.npz"} <= set(entry.files)
        profile = json.loads(bundle.profile_path(entry).read_text())
        assert profile["machine_class"]["id"] == entry.id
        assert profile["session_settings"]["intra_op_threads"] <= entry.key["cpus"]
        assert profile["machine"]["cpu_budget"]["cpus"] == entry.key["cpus"]


def test_a_one_cpu_class_is_measured_against_orts_default_capped_at_its_cpu(two_class_bundle):
    """ORT's default pool starts a thread per core whatever the affinity and pins it itself: the one-CPU
    tune quotes its speedup against that session capped at one thread, the full one against the default."""
    from ortpilot.providers.cpubudget import ort_default_threads

    if ort_default_threads() < 2:
        pytest.skip("ORT's default starts one thread here: nothing to cap")
    one = json.loads((two_class_bundle / this_class(1).name / "profile.json").read_text())
    full = json.loads((two_class_bundle / this_class().name / "profile.json").read_text())
    assert one["latency"]["measured_against"] == "ORT's default capped at 1 thread(s)"
    assert full["latency"]["measured_against"] == "ORT's default"
    report = (two_class_bundle / this_class(1).name / "report.md").read_text()
    assert "capped at 1 thread(s)" in report, report[:2000]


def test_load_profile_of_a_bundle_loads_this_machines_class_and_runs_like_it(two_class_bundle):
    sess = ortpilot.load_profile(two_class_bundle)
    assert sess.bundle.chosen == this_class() and sess.bundle.how == "this machine's class" and not sess.bundle.note
    plain = ortpilot.load_profile(sess.bundle.profile)
    assert plain.bundle is None
    feeds = make_feeds(sess.model, seed=3)
    assert np.array_equal(sess.run(None, feeds)[0], plain.run(None, feeds)[0])
    named = ortpilot.load_profile(two_class_bundle / "bundle.json", machine_class=this_class(1).name)
    assert named.bundle.chosen == this_class(1) and named.bundle.how == "named"
    assert named.profile["machine_class"]["name"] == this_class(1).name


def test_verify_on_one_cpu_takes_the_one_cpu_class_and_reproduces_it_bit_for_bit(two_class_bundle):
    pinned = _cli("verify", str(two_class_bundle), "--json", one_cpu=True)
    assert pinned.returncode == 0, pinned.stderr
    doc = json.loads(pinned.stdout)["profiles"][0]
    assert doc["bundle"]["class"]["name"] == this_class(1).name and doc["bundle"]["how"] == "this machine's class"
    assert doc["reference"]["mode"] == "bit-exact" and doc["passed"]
    here = _cli("verify", str(two_class_bundle))
    assert here.returncode == 0 and f"class {this_class().name}" in here.stdout


def test_no_profile_for_this_class_is_refused_naming_both_and_accept_machine_takes_the_nearest(bundle_copy):
    here, one = this_class(), this_class(1)
    shutil.rmtree(bundle_copy / here.name)
    file_bundle(bundle_copy, [one.name])
    with pytest.raises(VerificationError) as refused:
        ortpilot.load_profile(bundle_copy)
    message = str(refused.value)
    assert f"no profile for this machine's class, {here.name}" in message and f"it holds {one.name}" in message
    assert "accept_machine=True" in message
    near = ortpilot.load_profile(bundle_copy, accept_machine=True)
    assert near.bundle.chosen == one and near.bundle.how == "nearest"
    assert f"took the nearest class, {one.name}" in near.bundle.note and "cpus" in near.bundle.note
    done = _cli("verify", str(bundle_copy))
    assert done.returncode == 1 and done.stderr.count("error:") == 1 and here.name in done.stderr
    accepted = _cli("verify", str(bundle_copy), "--accept-machine")
    assert accepted.returncode == 0 and "nearest class" in accepted.stdout


def test_a_class_the_bundle_lacks_is_exit_2_listing_those_it_has(two_class_bundle):
    with pytest.raises(UsageError, match=f"has no class 'x86-nope-3cpu'; it holds .*{this_class(1).name}"):
        ortpilot.load_profile(two_class_bundle, machine_class="x86-nope-3cpu")
    done = _cli("verify", str(two_class_bundle), "--class", "x86-nope-3cpu")
    assert done.returncode == 2 and "has no class" in done.stderr


def test_a_missing_profile_fails_verify_naming_the_class_and_file(bundle_copy):
    one = this_class(1)
    (bundle_copy / one.name / "profile.json").unlink()
    done = _cli("verify", str(bundle_copy))
    assert done.returncode == 1 and done.stderr.count("error:") == 1
    assert f"the profile of class {one.name}" in done.stderr and "is missing" in done.stderr
    assert ortpilot.load_profile(bundle_copy).bundle.chosen == this_class()  # the other class still loads
    with pytest.raises(StampMismatchError, match="is missing"):
        ortpilot.load_profile(bundle_copy, machine_class=one.name)


def test_an_edited_profile_or_model_is_refused_before_it_loads(bundle_copy):
    here = this_class()
    profile = bundle_copy / here.name / "profile.json"
    profile.write_text(profile.read_text().replace('"intra_op_threads": 1', '"intra_op_threads": 2', 1) + " ")
    with pytest.raises(StampMismatchError, match="changed since the bundle was written"):
        ortpilot.load_profile(bundle_copy)
    done = _cli("verify", str(bundle_copy))
    assert done.returncode == 1 and f"profile of class {here.name}" in done.stderr


def test_two_profiles_for_one_class_are_exit_2(bundle_copy):
    doc = json.loads((bundle_copy / "bundle.json").read_text())
    twin = dict(doc["classes"][0], folder="twin")
    shutil.copytree(bundle_copy / doc["classes"][0]["folder"], bundle_copy / "twin")
    doc["classes"].append(twin)
    (bundle_copy / "bundle.json").write_text(json.dumps(doc))
    with pytest.raises(UsageError, match="lists two profiles for one class"):
        ortpilot.load_profile(bundle_copy)
    done = _cli("verify", str(bundle_copy))
    assert done.returncode == 2 and "twin/" in done.stderr and done.stderr.count("error:") == 1


def test_an_edited_class_key_or_a_profile_filed_under_another_class_is_refused(bundle_copy):
    doc = json.loads((bundle_copy / "bundle.json").read_text())
    edited = json.loads(json.dumps(doc))
    edited["classes"][0]["class"]["key"]["cpus"] = 64
    (bundle_copy / "bundle.json").write_text(json.dumps(edited))
    with pytest.raises(UsageError, match="the key was edited"):
        ortpilot.load_profile(bundle_copy)
    swapped = json.loads(json.dumps(doc))
    first, second = swapped["classes"]
    first["folder"], second["folder"] = second["folder"], first["folder"]
    first["files"], second["files"] = second["files"], first["files"]
    (bundle_copy / "bundle.json").write_text(json.dumps(swapped))
    with pytest.raises(StampMismatchError, match="but the profile was tuned for class id"):
        ortpilot.load_profile(bundle_copy)
    (bundle_copy / "bundle.json").write_text(json.dumps({**doc, "classes": "all"}))
    with pytest.raises(UsageError, match="invalid field 'classes'"):
        ortpilot.load_profile(bundle_copy)


def test_an_incomplete_bundle_says_what_is_missing_and_still_serves_the_classes_it_has(bundle_copy):
    one = this_class(1)
    shutil.rmtree(bundle_copy / one.name)
    why = "node 7d5ad495 (127.0.0.1) died during its search (NodeDiedError)"
    file_bundle(bundle_copy, [this_class().name], missing=[{"class": one.to_dict(), "why": why, "nodes": ["7d5ad495"]}])
    bundle = read_bundle(bundle_copy)
    assert not bundle.complete and bundle.missing[0]["why"] == why
    assert ortpilot.load_profile(bundle_copy).bundle.complete is False
    done = _cli("verify", str(bundle_copy), one_cpu=True)
    assert done.returncode == 1 and f"not tuned: {one.name}" in done.stderr


def test_export_triton_writes_one_model_per_class_or_the_class_named(two_class_bundle, tmp_path):
    pytest.importorskip("tritonclient.grpc")
    from ortpilot.export import export_triton, export_triton_bundle

    results = export_triton_bundle(two_class_bundle, tmp_path / "repo")
    assert sorted(r.name for r in results) == sorted(f"mlp-{c.name}" for c in (this_class(), this_class(1)))
    threads = {r.name: r.config_text for r in results}
    one = threads[f"mlp-{this_class(1).name}"]
    assert 'key: "intra_op_thread_count"' in one and 'string_value: "1"' in one
    single = export_triton(two_class_bundle, tmp_path / "one", machine_class=this_class(1).name)
    assert single.name == "mlp" and single.profile.parent.name == this_class(1).name
    with pytest.raises(UsageError, match="name the class to export with --class"):
        export_triton(two_class_bundle, tmp_path / "none")
    done = _cli(
        "export", "triton", str(two_class_bundle), "-o", str(tmp_path / "cli"), "--emit-inferenceservice", "x.yaml"
    )
    assert done.returncode == 2 and "export one class of the bundle with --class" in done.stderr
    plain = _cli("export", "triton", str(single.profile), "-o", str(tmp_path / "p"), "--class", "x")
    assert plain.returncode == 2 and "is not a bundle" in plain.stderr


def test_serve_resolves_a_bundle_to_this_machines_class_and_hands_replicas_the_bundle(two_class_bundle):
    from ortpilot.serve.options import resolve_models

    (spec,) = resolve_models([str(two_class_bundle)])
    assert spec.kind == "profile" and spec.name == "mlp"
    assert spec.bundle == str((two_class_bundle / "bundle.json").resolve())
    assert Path(spec.path).parent.name == this_class().name


def test_doctor_prints_this_machines_class():
    done = _cli("doctor", "--no-probe", "--json")
    assert json.loads(done.stdout)["machine_class"]["id"] == this_class().id
    shown = _cli("doctor", "--no-probe")
    assert "machine class" in shown.stdout and this_class().name in shown.stdout
