"""``ortpilot verify`` and ``load_profile``'s machine check: profiles re-verified where they land."""

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
from ortpilot.errors import VerificationError
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
    assert doc["session_settings"]["intra_op_threads"] >= 1 and doc["session_settings"]["inter_op_threads"] >= 1
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


def test_a_profile_without_a_reference_sample_says_what_it_did_not_check(tmp_path, demo_paths):
    model = tmp_path / "model.onnx"
    shutil.copy(demo_paths["mlp"], model)
    path = write_profile(
        tmp_path / "profile.json",
        model_file=model,
        machine=machine_facts(),
        providers=[{"name": "CPUExecutionProvider", "options": {}}],
        settings={"intra_op_threads": 1},
    )
    result = verify_profile(path)
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


def test_a_malformed_machine_section_is_exit_2_naming_the_field(tmp_path, demo_paths):
    model = tmp_path / "model.onnx"
    shutil.copy(demo_paths["mlp"], model)
    machine = {**machine_facts(), "cpu_budget": {"cpus": "two"}}
    path = write_profile(
        tmp_path / "profile.json",
        model_file=model,
        machine=machine,
        providers=[{"name": "CPUExecutionProvider", "options": {}}],
        settings={"intra_op_threads": 1},
    )
    proc = subprocess.run([*CLI, "verify", str(path)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "machine.cpu_budget.cpus" in proc.stderr and "Traceback" not in proc.stderr


@pytest.fixture(scope="module")
def tuned(tmp_path_factory, demo_paths):
    """A real tune of the demo MLP, copied fresh for each test that edits it."""
    out = tmp_path_factory.mktemp("tuned") / "out"
    tune(str(demo_paths["mlp"]), out, budget_s=10)
    return out


def _edited(tuned, tmp_path, edit=None):
    out = tmp_path / "out"
    shutil.copytree(tuned, out)
    if edit:
        doc = json.loads((out / "profile.json").read_text())
        edit(doc, out)
        (out / "profile.json").write_text(json.dumps(doc))
    return out


def _verify(*args):
    return subprocess.run([*CLI, "verify", *map(str, args)], capture_output=True, text=True, timeout=300)


def _set(doc, keys, value):
    for key in keys[:-1]:
        doc = doc[key]
    doc[keys[-1]] = value


@pytest.mark.parametrize(
    "case,edit,code,message",
    [
        (
            "model changed",
            lambda doc, out: (out / "model.onnx").write_bytes((out / "model.onnx").read_bytes() + b"\0"),
            1,
            "changed since it was tuned",
        ),
        (
            "provider missing",
            lambda doc, out: _set(doc, ["providers"], [{"name": "CUDAExecutionProvider", "options": {}}]),
            1,
            "CUDAExecutionProvider",
        ),
        (
            "placement changed",
            lambda doc, out: _set(doc, ["placement"], {"CPUExecutionProvider": 999}),
            1,
            "recorded placement",
        ),
        (
            "outputs changed",
            lambda doc, out: _set(
                doc, ["reference_outputs", "sha256"], dict.fromkeys(doc["reference_outputs"]["sha256"], "0" * 64)
            ),
            1,
            "does not reproduce its reference outputs",
        ),
        (
            "threads over the budget",
            lambda doc, out: _set(doc, ["session_settings", "intra_op_threads"], 4096),
            1,
            "this process may use",
        ),
        (
            "not a profile",
            lambda doc, out: (out / "profile.json").write_text("[1, 2]") and None,
            2,
            "not an ortpilot profile",
        ),
        ("reference damaged", lambda doc, out: (out / "reference.npz").write_bytes(b"not a zip"), 2, "reference file"),
    ],
)
def test_verify_exit_codes_for_every_failure_kind(tuned, tmp_path, case, edit, code, message):
    out = tmp_path / "out"
    shutil.copytree(tuned, out)
    doc = json.loads((out / "profile.json").read_text())
    edit(doc, out)
    if case != "not a profile":
        (out / "profile.json").write_text(json.dumps(doc))
    proc = _verify(out)
    assert proc.returncode == code, (case, proc.stderr)
    assert message in proc.stderr and "Traceback" not in proc.stderr, proc.stderr


def test_verify_max_slowdown_holds_the_profile_to_its_recorded_speedup(tuned, tmp_path):
    out = _edited(tuned, tmp_path)
    proc = _verify(out, "--max-slowdown", "50", "--duration", "2", "--json")
    doc = json.loads(proc.stdout)
    latency = doc["profiles"][0]["latency"]
    recorded = json.loads((out / "profile.json").read_text())["latency"]["speedup_vs_default"]["ratio"]
    assert latency["recorded_speedup"] == pytest.approx(recorded) and latency["ci95"][0] <= latency["speedup"]
    assert proc.returncode == (0 if latency["passed"] else 1), proc.stderr
    # a promise no session can keep: 100x ORT's default
    slow = _edited(tuned, tmp_path / "slow", lambda d, o: _set(d, ["latency", "speedup_vs_default", "ratio"], 100.0))
    proc = _verify(slow, "--max-slowdown", "10", "--duration", "2")
    assert proc.returncode == 1 and "slower than it was tuned" in proc.stderr and "100.00x recorded" in proc.stderr


@pytest.mark.parametrize("value", ["0", "-5", "ten", "inf"])
def test_verify_max_slowdown_must_be_a_positive_number(tuned, value):
    proc = _verify(tuned, "--max-slowdown", value)
    assert proc.returncode == 2 and "--max-slowdown must be" in proc.stderr


def test_verify_max_slowdown_needs_the_source_model(tuned, tmp_path):
    out = _edited(tuned, tmp_path, lambda d, o: _set(d, ["source_model", "path"], str(tmp_path / "gone.onnx")))
    proc = _verify(out, "--max-slowdown", "10")
    assert proc.returncode == 2 and "missing here or changed" in proc.stderr
