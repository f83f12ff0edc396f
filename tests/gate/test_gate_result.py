"""A gate's result (``gate.result``): the record a tune journals, and the one warning about what a gate
decided on (generated inputs, fewer than 16 samples)."""

from __future__ import annotations

import math

import numpy as np

from ortpilot.gate.outputs import OutputGate
from ortpilot.gate.result import (
    MIN_GATE_SAMPLES,
    MIN_SEQUENCE_SAMPLES,
    SEQUENCE_SAMPLES_WHY,
    GateResult,
    few_samples_warning,
    gate_data_warning,
)


def test_gate_result_reads_back_the_record_a_tune_journals():
    record = {
        "passed": False,
        "max_error": 0.01,
        "worst_error": math.inf,
        "samples": 50,  # how many held out: tune's INT8 aim loosens with it (tuning.search.int8_margin)
        "outputs": [
            {"name": "a", "metric": "cosine", "error": 0.002},
            {"name": "b", "metric": "top1", "error": math.inf, "note": "output missing"},
        ],
    }
    result = GateResult.from_dict(record)
    assert not result.passed and result.worst_output == "b" and result.error == math.inf
    assert result.samples == 50 and result.to_dict() == record
    older = {k: v for k, v in record.items() if k != "samples"}  # a journal written before the count
    assert GateResult.from_dict(older).samples == 0


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


def test_the_few_samples_warning_carries_the_minimum_a_metric_needs():
    """A ctc gate needs 59 samples (0.95**59 < 5 %: a 1-in-20 change of decoded sequences is seen 19 times in
    20); the same warning, with that minimum and its reason, and no second one."""
    assert MIN_SEQUENCE_SAMPLES == 59 and 0.95**MIN_SEQUENCE_SAMPLES < 0.05 <= 0.95 ** (MIN_SEQUENCE_SAMPLES - 1)
    said = few_samples_warning(40, MIN_SEQUENCE_SAMPLES, SEQUENCE_SAMPLES_WHY)
    assert "only 40 held-out sample(s), fewer than 59 to see a model that changes 1 decoded sequence in 20" in said
    assert "give 236 or more" in said and few_samples_warning(59, MIN_SEQUENCE_SAMPLES) == ""
    both = gate_data_warning(40, "x=1x3x48x160", MIN_SEQUENCE_SAMPLES, SEQUENCE_SAMPLES_WHY)
    assert both.count("fewer than 59") == 1 and "synthetic" in both
    result = GateResult([], samples=40, min_samples=MIN_SEQUENCE_SAMPLES, min_samples_why=SEQUENCE_SAMPLES_WHY)
    assert result.warning == said
    assert GateResult([], samples=40).warning == ""  # 16 suffice for the other metrics


def test_the_reach_of_a_worst_sample_verdict_is_said_below_299_held_out_samples():
    """One sentence in 2,000 broke where the worst of 50 held out passed: the report says what 50 can show."""
    from ortpilot.gate.result import SAMPLES_TO_SEE_RARE, rare_break_clause

    assert "worst of 50 held-out samples" in rare_break_clause(50) and "39% of the time" in rare_break_clause(50)
    assert rare_break_clause(SAMPLES_TO_SEE_RARE) == "" and rare_break_clause(0) == ""
    assert 1 - 0.99**SAMPLES_TO_SEE_RARE >= 0.95 > 1 - 0.99 ** (SAMPLES_TO_SEE_RARE - 1)
