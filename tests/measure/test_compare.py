"""Accuracy metrics of ``ortpilot.measure.compare`` on arrays with known errors, and on real sessions."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from ortpilot.errors import UsageError
from ortpilot.measure.compare import (
    Tolerances,
    choose_metric,
    compare_arrays,
    compare_models,
    compare_runs,
    metric_error,
)


def test_identical_outputs_have_zero_error_and_infinite_snr():
    a = np.arange(12, dtype=np.float32).reshape(3, 4)
    s = compare_arrays("y", [a], [a.copy()])
    assert s.max_abs == 0 and s.min_atol == 0 and s.min_rtol == 0
    assert s.cosine == pytest.approx(1.0) and math.isinf(s.snr_db) and s.passed


def test_known_error_gives_exact_statistics_and_min_tolerances():
    ref = np.array([1.0, 2.0, 4.0, 8.0], dtype=np.float32)
    test = ref + np.array([0.0, 0.1, 0.0, -0.4], dtype=np.float32)
    s = compare_arrays("y", [ref], [test], atol=1e-3, rtol=1e-3)
    assert s.max_abs == pytest.approx(0.4, rel=1e-5)
    assert s.min_atol == pytest.approx(0.4, rel=1e-5)
    assert s.min_rtol == pytest.approx(0.05, rel=1e-5)  # 0.1 / 2 and 0.4 / 8
    assert s.mean_abs == pytest.approx(0.125, rel=1e-5)
    assert not s.passed
    expected_snr = 10 * math.log10((1 + 4 + 16 + 64) / (0.01 + 0.16))
    assert s.snr_db == pytest.approx(expected_snr, rel=1e-4)
    assert compare_arrays("y", [ref], [test], atol=0.4001, rtol=0).passed


def test_class_scores_get_top1_and_top5_agreement():
    ref = np.eye(10, dtype=np.float32)[[1, 2, 3, 4]]  # 4 rows, argmax 1..4
    test = ref.copy()
    test[0] = 0
    test[0, 7] = 1.0  # row 0's top-1 moves to class 7, class 1 drops out of its top 1
    s = compare_arrays("logits", [ref], [test])
    assert s.top1_agreement == pytest.approx(0.75)
    assert s.metric == "top1" and s.error == pytest.approx(0.25)


def test_nan_and_inf_are_counted_and_fail():
    ref = np.ones(4, dtype=np.float32)
    test = np.array([1, np.nan, np.inf, 1], dtype=np.float32)
    s = compare_arrays("y", [ref], [test], atol=1.0, rtol=1.0)
    assert (s.nan_test, s.inf_test, s.nan_ref) == (1, 1, 0)
    assert not s.passed and math.isinf(s.max_abs)
    json.dumps(s.to_dict())  # infinities serialize


@pytest.mark.parametrize(
    ("name", "shape", "metric"),
    [
        ("logits", (1, 1000), "top1"),
        ("y", (4, 10), "cosine"),  # a small 2-D float output is not class scores without evidence
        ("probs", (1, 1), "rel_l2"),  # one score per row: top-1 cannot disagree
        ("last_hidden_state", (1, 128, 384), "cosine"),
        ("sentence_embedding", (1, 384), "cosine"),
        ("boxes", (1, 100, 4), "rel_l2"),
        ("output", (1, 1), "rel_l2"),
        ("logits", (1, 16, 256), "top1"),
    ],
)
def test_metric_choice(name, shape, metric):
    assert choose_metric(name, shape) == metric
    assert choose_metric(name, shape, np.int64) == "exact"


def test_metric_values():
    ref = [np.array([[1.0, 0.0], [0.0, 1.0]])]
    assert metric_error("cosine", ref, [np.array([[0.0, 1.0], [0.0, 1.0]])]) == pytest.approx(0.5)
    assert metric_error("rel_l2", [np.array([3.0, 4.0])], [np.array([3.0, 4.5])]) == pytest.approx(0.1)


def test_per_output_tolerances_parse_and_apply():
    tol = Tolerances.parse(["1e-4", "logits:1e-2"], ["probs:0.5"])
    assert tol.for_output("logits") == (1e-2, 1e-5)
    assert tol.for_output("probs") == (1e-4, 0.5)
    assert tol.explicit
    with pytest.raises(UsageError, match="not a number"):
        Tolerances.parse(["logits:abc"])
    ref = [{"logits": np.array([1.0, 2.0]), "other": np.array([1.0])}]
    test = [{"logits": np.array([1.005, 2.0]), "other": np.array([1.0])}]
    c = compare_runs(ref, test, tol)
    assert c.passed
    c = compare_runs(ref, test, Tolerances.parse(["1e-4"]))
    assert not c.passed and [o.name for o in c.outputs if not o.passed] == ["logits"]


def test_compare_two_models_and_one_model_on_two_providers(demo_paths):
    same = compare_models(str(demo_paths["cnn"]), str(demo_paths["cnn"]), n_samples=2)
    assert same.outputs[0].max_abs == 0 and same.samples == 2
    two_eps = compare_models(str(demo_paths["mlp"]), None, ["cpu", "cpu"])
    assert two_eps.passed and "on cpu" in two_eps.test
    with pytest.raises(UsageError, match="exactly two providers"):
        compare_models(str(demo_paths["mlp"]), None, ["cpu"])


def test_compare_chooses_each_metric_from_what_the_model_returns_as_the_gate_does(tmp_path):
    """Issue 38: the recognizer declares ``[1, seqlen]`` (cosine by the graph alone) and returns ``[20, 1, 40]``
    class scores over steps: compare reads the real outputs, gates on ctc, and reports the per-step top-1
    and the decoded sequences beside the error; dynamic INT8 changes some sequences."""
    import onnx
    from metric_models import ctc_recognizer, text_images

    from ortpilot.passes.quantize import QuantizePass

    source, int8 = tmp_path / "rec.onnx", tmp_path / "rec-int8.onnx"
    onnx.save(ctc_recognizer(), source)
    onnx.save(QuantizePass("dynamic").run(onnx.load(source)).model, int8)
    result = compare_models(str(source), str(int8), samples=text_images(64))
    (out,) = result.outputs
    assert out.metric == "ctc" and "declared [1, seqlen] but returns [20, 1, 40]" in out.metric_evidence
    assert 0.9 < out.step_top1_agreement < 1.0 and out.sequence_exact_match < 1.0
    assert out.error == pytest.approx(1.0 - out.sequence_exact_match)  # the decoded sequences decide
    assert out.to_dict()["sequence_exact_match"] == out.sequence_exact_match
    forced = compare_models(str(source), str(int8), samples=text_images(8), metrics="cosine").outputs[0]
    assert forced.metric == "cosine" and forced.sequence_exact_match is None  # --metric stays as given
