"""Profiles re-verified where they land: ``verify_profile``, ``load_profile``'s machine check, and ``ortpilot
verify`` on them; the command's exit code for every failure kind and ``--max-slowdown`` are in
tests/cli/test_cmd_verify.py."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import warnings

import numpy as np
import pytest

from ortpilot.artifacts.profile import write_profile
from ortpilot.errors import UsageError, VerificationError
from ortpilot.graph.feeds import make_feeds
from ortpilot.modelio import load_model
from ortpilot.passes.quantize import QuantizePass
from ortpilot.providers.cpuisa import KERNEL_FLAGS, int8_rule
from ortpilot.providers.machine import machine_facts
from ortpilot.session import load
from ortpilot.session.profile import MachineMismatchWarning, load_profile
from ortpilot.tuning import tune
from ortpilot.tuning.verify import verify_profile

CLI = [sys.executable, "-m", "ortpilot.cli.main"]


def _other_int8_machine() -> dict:
    """A machine section of the other INT8 kind than this CPU's (VNNI-exact vs AVX2-saturating)."""
    flags = dict.fromkeys(KERNEL_FLAGS, False)
    flags["avx2"] = True
    if int8_rule().u8s8_saturates:  # here it saturates: the profile comes from a VNNI machine
        flags.update(avx512f=True, avx512bw=True, avx512_vnni=True)
        return {
            "cpu": "Tuning CPU with VNNI",
            "arch": "x86_64",
            "isa_flags": flags,
            "int8": {"rule": "vnni", "u8s8_exact": True},
            "cores": 2,
            "cpu_budget": {"cpus": 2},
        }
    return {
        "cpu": "Tuning CPU without VNNI",
        "arch": "x86_64",
        "isa_flags": flags,
        "int8": {"rule": "x86-no-vnni", "u8s8_exact": False},
        "cores": 2,
        "cpu_budget": {"cpus": 2},
    }


@pytest.fixture
def int8_profile(tmp_path, demo_paths):
    """A dynamic-INT8 profile of the demo MLP, recorded as tuned on the other kind of INT8 kernel."""
    result = QuantizePass("dynamic", per_channel=True).run(demo_paths["mlp"])
    model = tmp_path / "model.onnx"
    result.save(model)
    feeds = make_feeds(load_model(demo_paths["mlp"]), seed=7)
    sess = load(str(model), settings=None)
    outputs = dict(zip([o.name for o in sess.get_outputs()], sess.run(None, feeds)))
    np.savez(
        tmp_path / "reference.npz",
        **{f"inputs/{k}": v for k, v in feeds.items()},
        **{f"outputs/{k}": v for k, v in outputs.items()},
    )
    return write_profile(
        tmp_path / "profile.json",
        model_file=model,
        machine=_other_int8_machine(),
        providers=[{"name": "CPUExecutionProvider", "options": {}}],
        settings={"intra_op_threads": 1, "inter_op_threads": 1},
        passes=[result.record.to_dict()],
        accuracy={"max_error": 0.05, "outputs": [{"name": "y", "metric": "rel_l2", "error": 0.01}]},
        extra={
            "candidate": {"passes": [{"pass": "quantize", "mode": "dynamic"}]},
            "reference_outputs": {"file": "reference.npz"},
        },
    )


@pytest.mark.isa
def test_an_int8_profile_from_the_other_int8_kernel_is_refused_naming_both_cpus(int8_profile):
    with pytest.raises(VerificationError) as err:
        load_profile(int8_profile)
    text = str(err.value)
    assert "Tuning CPU" in text and machine_facts()["cpu"] in text and "accept_machine=True" in text
    assert "--accept-machine" in text and "'ortpilot tune'" in text
    result = verify_profile(int8_profile, accept_machine=True)
    assert result.passed and result.mode == "tolerance" and "bit-exact outputs are not expected" in result.why


def test_the_cli_refuses_it_with_exit_1_and_loads_it_with_accept_machine(int8_profile):
    proc = subprocess.run([*CLI, "verify", str(int8_profile)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1 and "Tuning CPU" in proc.stderr and "Traceback" not in proc.stderr
    proc = subprocess.run(
        [*CLI, "verify", str(int8_profile), "--accept-machine", "--json"], capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    assert doc["passed"] and doc["profiles"][0]["reference"]["mode"] == "tolerance"
    assert [d["field"] for d in doc["profiles"][0]["machine"]["differences"] if d["decisive"]] == ["int8"]


def test_warn_policy_loads_with_a_warning(int8_profile):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        sess = load_profile(int8_profile, policy="warn")
    assert any(issubclass(w.category, MachineMismatchWarning) for w in caught)
    assert sess.machine_check.decisive


def test_a_fresh_tune_verifies_bit_for_bit_here_and_a_changed_output_fails(tmp_path, demo_paths):
    out = tmp_path / "out"
    tune(str(demo_paths["mlp"]), out, budget_s=12)
    result = verify_profile(out)
    assert result.passed and result.mode == "bit-exact" and result.outputs
    doc = json.loads((out / "profile.json").read_text())
    threads = doc["session_settings"]["intra_op_threads"], doc["session_settings"]["inter_op_threads"]
    # explicit thread counts, except ORT's default kept as it is: the session the tune measured
    assert threads == (0, 0) if doc["candidate"]["baseline"] else min(threads) >= 1
    with np.load(out / "reference.npz") as data:
        arrays = {k: data[k] for k in data.files}
    name = next(k for k in arrays if k.startswith("outputs/"))
    arrays[name] = arrays[name] + 1e-3
    np.savez(out / "reference.npz", **arrays)
    proc = subprocess.run([*CLI, "verify", str(out)], capture_output=True, text=True, timeout=120)
    # bit-exact compares the recorded hashes, which the edit did not touch: still 0; the file is not trusted
    assert proc.returncode == 0, proc.stderr
    doc["reference_outputs"]["sha256"] = dict.fromkeys(doc["reference_outputs"]["sha256"], "0" * 64)
    (out / "profile.json").write_text(json.dumps(doc))
    proc = subprocess.run([*CLI, "verify", str(out)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1 and "does not reproduce its reference outputs" in proc.stderr
    (out / "reference.npz").unlink()  # named by the profile: a missing one is a failure, not "not checked"
    proc = subprocess.run([*CLI, "verify", str(out)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1 and "reference sample" in proc.stderr and "is missing" in proc.stderr, proc.stderr


def _bare_profile(tmp_path, demo_paths):
    """A profile of the demo MLP as write_profile makes it, with no reference sample."""
    model = tmp_path / "model.onnx"
    shutil.copy(demo_paths["mlp"], model)
    return write_profile(
        tmp_path / "profile.json",
        model_file=model,
        machine=machine_facts(),
        providers=[{"name": "CPUExecutionProvider", "options": {}}],
        settings={"intra_op_threads": 1},
    )


def test_a_profile_without_a_reference_sample_says_what_it_did_not_check(tmp_path, demo_paths):
    result = verify_profile(_bare_profile(tmp_path, demo_paths))
    assert result.mode == "not checked" and result.passed and "reference.npz is missing" in result.why


def test_a_tune_pinned_to_one_cpu_records_one_intra_op_thread(tmp_path):
    """ORT's default pool ignores the affinity mask (it would start 2+ threads on 1 CPU): the profile
    must record the thread count this process may really use."""
    out = tmp_path / "out"
    proc = subprocess.run(
        [*CLI, "tune", "demo:mlp", "--budget", "20", "-o", str(out)],
        capture_output=True,
        text=True,
        timeout=300,
        preexec_fn=lambda: os.sched_setaffinity(0, {min(os.sched_getaffinity(0))}),
    )
    assert proc.returncode == 0, proc.stderr
    doc = json.loads((out / "profile.json").read_text())
    assert doc["session_settings"]["intra_op_threads"] == 1
    assert doc["machine"]["cpu_budget"] == {"cpus": 1, "source": "affinity"}


def test_a_class_asked_of_a_single_profile_is_refused_from_python_too(tmp_path, demo_paths):
    with pytest.raises(UsageError, match="is a single profile, of one class"):
        verify_profile(_bare_profile(tmp_path, demo_paths), machine_class="x86-vnni-2cpu")
