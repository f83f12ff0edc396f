"""``ortpilot doctor`` through click: its JSON document and its tables."""

from __future__ import annotations

import json

from click.testing import CliRunner

from ortpilot.cli.main import cli


def _invoke(*args: str):
    return CliRunner().invoke(cli, list(args), catch_exceptions=False)


def test_doctor_json_is_valid_and_exit_0():
    result = _invoke("doctor", "--json")
    assert result.exit_code == 0, result.stderr
    doc = json.loads(result.stdout)
    assert set(doc) >= {
        "onnxruntime",
        "distributions",
        "plugins",
        "ep_devices",
        "probes",
        "cpu",
        "gpu",
        "findings",
        "exit_code",
    }


def test_doctor_human_output_has_tables():
    result = _invoke("doctor", "--no-probe")
    assert result.exit_code == 0
    assert "Findings" in result.stdout and "Providers" in result.stdout


def test_doctor_names_the_cpus_ort_default_pins_a_pool_thread_to_and_what_to_do(demo_paths):
    """ORT's default session pins a pool thread per core beyond the first; a calling thread that lands on that
    CPU shares it (the demo encoder's default 1.5-1.7x slower): doctor names the CPU and the fix."""
    import os

    import onnxruntime as ort

    from ortpilot.measure.placement import pinned_cpus
    from ortpilot.providers.cpubudget import ort_default_pinned

    doc = json.loads(_invoke("doctor", "--json", "--no-probe").stdout)
    notes = [f for f in doc["findings"] if "pins a pool thread" in f["message"]]
    if not ort_default_pinned():  # one CPU, or a pool pinned to groups of CPUs: nothing to say
        assert notes == [], notes
        return
    assert len(notes) == 1 and notes[0]["severity"] == "info", notes
    named = {int(c) for c in notes[0]["message"].split("to CPU ")[1].split(";")[0].split(", ")}
    assert "intra_op_num_threads" in notes[0]["fix"]
    # a live default session of a real model pins its pool threads to exactly those CPUs
    sess = ort.InferenceSession(str(demo_paths["mlp"]), providers=["CPUExecutionProvider"])
    assert named <= pinned_cpus() and min(os.sched_getaffinity(0)) not in named, (named, pinned_cpus())
    del sess
