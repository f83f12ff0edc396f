"""A gate's result (``gate.result``): the record a tune journals, and the one warning about what a gate
decided on (generated inputs, fewer than 16 samples)."""

from __future__ import annotations

import math

import numpy as np

from ortpilot.gate.outputs import OutputGate
from ortpilot.gate.result import MIN_GATE_SAMPLES, GateResult, few_samples_warning, gate_data_warning


def test_gate_result_reads_back_the_record_a_tune_journals():
    record = {
        "passed": False,
        "max_error": 0.01,
        "worst_error": math.inf,
        "outputs": [
            {"name": "a", "metric": "cosine", "error": 0.002},
            {"name": "b", "metric": "top1", "error": math.inf, "note": "output missing"},
        ],
    }
    result = GateResult.from_dict(record)
    assert not result.passed and result.worst_output == "b" and result.error == math.inf
    assert result.to_dict() == record


def test_a_gate_on_fewer_than_16_samples_says_so():
    ref = {"y": [np.ones((1, 8), np.float32)] * (MIN_GATE_SAMPLES - 1)}
    few = OutputGate(0.01).check(ref, ref)
    assert "fewer than 16" in few.warning and "fewer than 16" in few.summary
    enough = OutputGate(0.01).check({"y": ref["y"] * 2}, {"y": ref["y"] * 2})
    assert enough.warning == "" and "fewer than" not in enough.summary
    assert GateResult([], samples=0).warning == ""


def test_the_gate_data_warning_says_synthetic_and_few_in_one_message():
    both = gate_data_warning(4, "x=1x64")
    assert "4 synthetic inputs (x=1x64)" in both and "fewer than 16" in both and "--calibration-text" in both
    synthetic = gate_data_warning(MIN_GATE_SAMPLES, "x=1x64")
    assert "synthetic inputs" in synthetic and "fewer than" not in synthetic
    assert gate_data_warning(4) == few_samples_warning(4) and gate_data_warning(MIN_GATE_SAMPLES) == ""
